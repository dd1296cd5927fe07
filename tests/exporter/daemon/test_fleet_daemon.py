"""The fleet plan in the daemon: two emulated variants of one model over loopback HTTP, in manual
time; each variant's exported count is the plan's, the plan's figures are exported, a failed
inventory query keeps the last inventory and is counted."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from urllib.error import HTTPError
from urllib.request import urlopen

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from exporter.base.clock import ManualClock
from exporter.base.errors import FailureReason, PrometheusQueryError
from exporter.collector.demand import DemandRead
from exporter.collector.sources import ScrapeSource, SourceRead
from exporter.config.values import (
    AcceleratorConfig,
    Config,
    DeploymentConfig,
    FleetConfig,
    FleetModelConfig,
    SloConfig,
    SourceConfig,
)
from exporter.daemon.daemon import Daemon
from exporter.daemon.server import SizerHTTPServer
from exporter.daemon.statefile import StateFile
from exporter.sizing.reasons import Reason
from exporter.testbed.emulator import EmulatedFleet
from model import ServerConfig, ServiceParams
from model.calibration.prior import Accelerator, gpus_of, transferred
from model.simulation.workloads import LengthDist, LengthKind, RateProfile, RateSegment

FAST = ServiceParams(6.68, 2.01e-2, 5.52e-5)  # paper Table I, H100
SLOW = ServiceParams(16.0, 5.5e-2, 2.1e-4)  # about an L40S
CYCLE_S = 30.0


def emulated(params: ServiceParams, replicas: int, rate: float | RateProfile,
             clock: ManualClock, seed: int) -> EmulatedFleet:
    fleet = EmulatedFleet(
        params, ServerConfig(), rng=np.random.default_rng(seed), arrivals=rate,
        input_lengths=LengthDist(LengthKind.UNIFORM, 512),
        output_lengths=LengthDist(LengthKind.UNIFORM, 128),
        model_name="llama", replicas=replicas, clock=clock,
    )  # fmt: skip
    fleet.start(background=False)
    return fleet


class Scrape:
    def __init__(self, fleet: EmulatedFleet) -> None:
        self.fleet = fleet

    def read(self) -> SourceRead:
        return ScrapeSource(clock=self.fleet.sim_clock, urls=self.fleet.urls,
                            model_name="llama").read()


class NoPods:
    """A variant with no pod yet: every read finds none."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock

    def read(self) -> SourceRead:
        return SourceRead(time_s=self.clock.time(), samples=())


class Inventory:
    """An inventory query: its answers in turn, an error for None."""

    def __init__(self, *answers: float | None) -> None:
        self.answers = list(answers)

    def read(self) -> DemandRead:
        value = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if value is None:
            raise PrometheusQueryError("http://p/api/v1/query", "sum(gpus)", "down",
                                       reason=FailureReason.CONNECTION)
        return DemandRead(value=value, time_s=0.0)


def variant(name: str, accelerator: Accelerator, initial: ServiceParams | None,
            low: int = 0) -> DeploymentConfig:
    return DeploymentConfig(
        name=name, model_name="llama", source=SourceConfig(scrape_urls=("http://x:1/",)),
        server=ServerConfig(), slo=SloConfig(ttft_ms=80.0, itl_ms=25.0), min_replicas=low,
        max_replicas=8, initial_params=initial, accelerator=accelerator,
    )  # fmt: skip


def fleet_config(l40s_initial: ServiceParams | None, l40s_price: float = 1.0) -> Config:
    deps = (variant("on-h100", Accelerator.H100, FAST),
            variant("on-l40s", Accelerator.L40S, l40s_initial))
    fleet = FleetConfig(
        accelerators=(
            AcceleratorConfig(name=Accelerator.H100, price_per_gpu_hour=4.0, inventory=8),
            AcceleratorConfig(name=Accelerator.L40S, price_per_gpu_hour=l40s_price,
                              inventory_query="sum(gpus)"),
        ),
        models=(FleetModelConfig(name="llama", variants=("on-h100", "on-l40s")),),
    )  # fmt: skip
    return Config(cycle_period_s=CYCLE_S, deployments=deps, fleet=fleet)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def pair(clock: ManualClock) -> Iterator[tuple[EmulatedFleet, EmulatedFleet]]:
    fast, slow = emulated(FAST, 2, 6.0, clock, 1), emulated(SLOW, 1, 1.5, clock, 2)
    yield fast, slow
    fast.stop()
    slow.stop()


def run(daemon: Daemon, clock: ManualClock, fleets: tuple[EmulatedFleet, ...], count: int
        ) -> None:
    for _ in range(count):
        for _ in range(int(CYCLE_S)):
            clock.advance(1.0)
            for f in fleets:
                f.sync()
        daemon.run_cycle()


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value("vllm_sizer_" + name, labels)


def test_each_variant_exports_the_plans_count_and_the_plan_its_figures(
    pair: tuple[EmulatedFleet, EmulatedFleet], clock: ManualClock
) -> None:
    fast, slow = pair
    registry = CollectorRegistry()
    inventory = Inventory(3.0, None)  # 3 L40S, then the query fails
    daemon = Daemon(fleet_config(SLOW), {"on-h100": Scrape(fast), "on-l40s": Scrape(slow)},
                    registry, fast.sim_clock, inventory={"L40S": inventory})  # fmt: skip
    run(daemon, clock, pair, 6)
    fleet = daemon.fleet
    assert fleet is not None and fleet.last is not None and fleet.last.plan is not None
    plan = fleet.last.plan
    for name in ("on-h100", "on-l40s"):
        exported = value(registry, "desired_replicas", deployment=name, model_name="llama")
        assert exported == plan.desired[name], name
        reason = value(registry, "recommendation_reason", deployment=name, model_name="llama",
                       reason=Reason.FLEET_PLAN.value)
        assert reason == 1.0
    assert sum(plan.desired.values()) >= 1
    cost = 4.0 * plan.desired["on-h100"] + 1.0 * plan.desired["on-l40s"]
    assert value(registry, "fleet_cost_per_hour", model_name="llama") == pytest.approx(cost)
    assert value(registry, "fleet_unserved_requests_per_second", model_name="llama") == 0.0
    demand = value(registry, "fleet_demand_requests_per_second", model_name="llama")
    assert demand is not None and 6.0 < demand < 12.0  # 7.5 req/s arrive, plus margins
    # The inventory read once (3), then failing: the last value holds, each failure counted.
    assert value(registry, "fleet_gpus_available", accelerator="L40S") == 3.0
    assert value(registry, "fleet_gpus_available", accelerator="H100") == 8.0
    assert value(registry, "fleet_gpus_planned", accelerator="L40S") == plan.desired["on-l40s"]
    assert value(registry, "inventory_read_errors_total", accelerator="L40S",
                 reason=FailureReason.CONNECTION.value) == 5.0
    assert plan.desired["on-l40s"] <= 3
    chosen = [s.labels["reason"] for s in _samples(registry, "vllm_sizer_fleet_plan_reason")
              if s.value == 1.0]
    assert len(chosen) == 1
    # The what-if at the rate the plan was made for answers the plan's least-cost counts, over
    # HTTP as from the daemon itself.
    assert dict(daemon.predict_mix("llama", demand).replicas) == dict(plan.target)
    server = SizerHTTPServer("127.0.0.1", 0, registry, daemon.ready, daemon.predict,
                             mix=daemon.predict_mix)  # fmt: skip
    server.start()
    try:
        url = f"http://127.0.0.1:{server.port}/api/v1/predict?model=llama&rate={demand!r}"
        with urlopen(url, timeout=10) as reply:
            body = json.loads(reply.read())
        assert body["replicas"] == dict(plan.target)
        assert body["cost_per_hour"] == pytest.approx(
            sum(4.0 * n if k == "on-h100" else 1.0 * n for k, n in plan.target.items()))
        with pytest.raises(HTTPError) as missing:
            urlopen(f"http://127.0.0.1:{server.port}/api/v1/predict?model=qwen&rate=1",
                    timeout=10)
        assert missing.value.code == 404
        missing.value.close()
    finally:
        server.stop()


def test_the_cheap_variant_carries_the_load_when_it_is_cheap_enough(
    pair: tuple[EmulatedFleet, EmulatedFleet], clock: ManualClock
) -> None:
    fast, slow = pair
    registry = CollectorRegistry()
    free_l40s = fleet_config(SLOW, l40s_price=0.01)
    daemon = Daemon(free_l40s, {"on-h100": Scrape(fast), "on-l40s": Scrape(slow)}, registry,
                    fast.sim_clock, inventory={"L40S": Inventory(16.0)})  # fmt: skip
    run(daemon, clock, pair, 1)
    # The first read closes no window: no rate yet, so no plan (a plan for 0 req/s would
    # take every variant to its minimum, 0, and with no pod left the demand is never seen).
    assert daemon.fleet is not None and daemon.fleet.last is not None
    assert daemon.fleet.last.plan is None
    run(daemon, clock, pair, 3)
    fleet = daemon.fleet
    assert fleet is not None and fleet.last is not None and fleet.last.plan is not None
    # At 1/400th of the H100's price, L40S replicas carry everything (a scale-down of the
    # H100s waits for the L40S replicas to be ready: the target says where the plan goes).
    assert fleet.last.plan.target["on-h100"] == 0
    assert fleet.last.plan.target["on-l40s"] >= 2


def test_a_variant_without_pods_takes_its_trusted_siblings_prior(clock: ManualClock) -> None:
    # Holds at four loads: a calibration is trusted once it has seen loads apart.
    steps = RateProfile(tuple(RateSegment(4 * CYCLE_S, r, r) for r in (3.0, 6.0, 9.0, 12.0)))
    fast = emulated(FAST, 2, steps, clock, 5)
    try:
        registry = CollectorRegistry()
        daemon = Daemon(fleet_config(None), {"on-h100": Scrape(fast), "on-l40s": NoPods(clock)},
                        registry, fast.sim_clock, inventory={"L40S": Inventory(4.0)})
        run(daemon, clock, (fast,), 16)
        cycles = daemon.sizer.cycles
        own = cycles["on-h100"].tuner
        assert own.params is not None and own.fit_count > 0
        l40s = cycles["on-l40s"].tuner
        assert l40s.params is None  # no pod: no estimate of its own
        expected = transferred(own.params, gpus_of(Accelerator.H100), gpus_of(Accelerator.L40S))
        centre = l40s.prior.centre
        # The transfer follows the sibling's estimate of the cycle it was made in.
        assert centre.alpha_ms == pytest.approx(expected.alpha_ms, rel=0.2)
        assert centre.beta_ms / centre.alpha_ms == pytest.approx(
            expected.beta_ms / expected.alpha_ms, rel=0.2)
        assert value(registry, "variant_trusted", deployment="on-l40s", model_name="llama") == 0
        assert value(registry, "variant_trusted", deployment="on-h100", model_name="llama") == 1
        fleet = daemon.fleet
        assert fleet is not None and fleet.last is not None
        assert fleet.last.variants["on-l40s"].transferred_from == "on-h100"
    finally:
        fast.stop()


def _samples(registry: CollectorRegistry, name: str) -> list:  # type: ignore[type-arg]
    return [s for f in registry.collect() for s in f.samples if s.name == name]


class Switch:
    """No pods until `fleet` is set, then that fleet's pods."""

    def __init__(self, clock: ManualClock) -> None:
        self.none = NoPods(clock)
        self.fleet: EmulatedFleet | None = None

    def read(self) -> SourceRead:
        return self.none.read() if self.fleet is None else Scrape(self.fleet).read()


def test_a_transferred_variant_calibrates_on_its_own_pods_and_reports_the_transfer_error(
    clock: ManualClock,
) -> None:
    steps = RateProfile(tuple(RateSegment(4 * CYCLE_S, r, r) for r in (3.0, 6.0, 9.0, 12.0)))
    fast = emulated(FAST, 2, steps, clock, 5)
    late = Switch(clock)
    slow: EmulatedFleet | None = None
    try:
        registry = CollectorRegistry()
        daemon = Daemon(fleet_config(None), {"on-h100": Scrape(fast), "on-l40s": late},
                        registry, fast.sim_clock, inventory={"L40S": Inventory(4.0)})
        run(daemon, clock, (fast,), 16)
        fleet = daemon.fleet
        assert fleet is not None and fleet.last is not None
        assert fleet.last.variants["on-l40s"].transferred_from == "on-h100"
        # The L40S Deployment's first replicas become ready: loads apart, as the H100's were.
        slow_steps = RateProfile(tuple(RateSegment(4 * CYCLE_S, r, r)
                                       for r in (0.5, 1.0, 1.5, 2.0, 2.5)))
        slow = emulated(SLOW, 2, slow_steps, clock, 6)
        late.fleet = slow
        labels = {"deployment": "on-l40s", "model_name": "llama"}
        trusted_after = None
        for k in range(1, 21):  # 10 minutes of 30 s cycles
            run(daemon, clock, (fast, slow), 1)
            if registry.get_sample_value("vllm_sizer_variant_trusted", labels) == 1.0:
                trusted_after = k
                break
        assert trusted_after is not None, "not trusted within 10 minutes of its own pods"
        error = registry.get_sample_value(
            "vllm_sizer_variant_transfer_capacity_error_ratio", labels)
        # The rule moves the H100's alpha (about 6.7 ms) by the bandwidth ratio to about 26 ms,
        # where this L40S-like engine's is 16: the transferred prior under-counts its capacity
        # (to nothing when 26 ms reaches the 25 ms ITL target).
        assert error is not None and -1.0 <= error < 0.0
        status = fleet.last.variants["on-l40s"]
        assert status.transfer_capacity_error == error  # kept once, as first measured
    finally:
        fast.stop()
        if slow is not None:
            slow.stop()


def test_a_restart_restores_the_fleet_plans_memory(
    pair: tuple[EmulatedFleet, EmulatedFleet], clock: ManualClock, tmp_path: Path
) -> None:
    """The state file carries the fleet plan's memory: each variant's stabilization history,
    the last counts and the transfers (and the held inputs where the planner holds them).
    Restarted, the daemon plans from it; without it, a restart forgot the windows holding a
    scale-down and exported no count until a window closed."""
    fast, slow = pair
    state = tmp_path / "state.json"
    config = replace(fleet_config(SLOW), state_file=state)
    sources = {"on-h100": Scrape(fast), "on-l40s": Scrape(slow)}
    first = Daemon(config, sources, CollectorRegistry(), fast.sim_clock, StateFile(state),
                   inventory={"L40S": Inventory(16.0)})  # fmt: skip
    run(first, clock, pair, 6)
    assert first.fleet is not None
    saved = first.fleet.to_dict()
    assert saved["planner"]["windows"]
    assert saved["desired"]
    registry = CollectorRegistry()
    second = Daemon(config, sources, registry, fast.sim_clock, StateFile(state),
                    inventory={"L40S": Inventory(16.0)})  # fmt: skip
    assert second.fleet is not None
    assert json.loads(json.dumps(second.fleet.to_dict())) == json.loads(json.dumps(saved))
    # Its first read closes no window (no plan yet): each variant exports the restored count.
    run(second, clock, pair, 1)
    for name, count in saved["desired"].items():
        assert value(registry, "desired_replicas", deployment=name, model_name="llama") == count


def test_an_unusable_saved_fleet_state_starts_the_plan_fresh(
    pair: tuple[EmulatedFleet, EmulatedFleet], clock: ManualClock, tmp_path: Path
) -> None:
    fast, _ = pair
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"deployments": {}, "fleet": {"planner": {"credit": "x"}}}))
    config = replace(fleet_config(SLOW), state_file=state)
    daemon = Daemon(config, {"on-h100": Scrape(fast), "on-l40s": Scrape(pair[1])},
                    CollectorRegistry(), fast.sim_clock, StateFile(state),
                    inventory={"L40S": Inventory(16.0)})  # fmt: skip
    assert daemon.fleet is not None and daemon.fleet.to_dict()["desired"] == {}
