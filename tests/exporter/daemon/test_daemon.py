"""The daemon's cycle against emulated vLLM replicas over real loopback HTTP, in manual time.

The emulator runs without its thread: the test advances a ManualClock and syncs it, so every
window is exactly 30 simulated seconds and the whole file runs in seconds.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from urllib.error import HTTPError
from urllib.request import urlopen

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.base.clock import ManualClock
from exporter.base.errors import FailureReason, ScrapeError
from exporter.collector.sources import SourceRead
from exporter.config.values import Config, DeploymentConfig, SloConfig, SourceConfig, TunerConfig
from exporter.daemon.daemon import Daemon
from exporter.daemon.server import SizerHTTPServer
from exporter.daemon.statefile import StateFile
from exporter.testbed.emulator import EmulatedFleet
from model import ServerConfig, ServiceParams
from model.simulation.workloads import LengthDist, LengthKind

LLAMA = ServiceParams(6.68, 2.01e-2, 5.52e-5)
SERVER = ServerConfig()
CYCLE_S = 30.0
EXPORTED = [
    "desired_replicas", "current_replicas", "predicted_ttft_seconds", "predicted_itl_seconds",
    "observed_ttft_seconds", "observed_itl_seconds", "arrival_rate_requests_per_second",
    "max_rate_per_replica_requests_per_second", "saturation_rate_per_replica_requests_per_second",
    "model_alpha_seconds", "model_beta_seconds", "model_gamma_seconds", "fit_error_ratio",
    "slo_ttft_seconds", "slo_itl_seconds", "recommendation_reason", "tuner_state", "tuner_reason",
    "saturated", "slo_headroom_ratio", "source_up", "pods_observed",
    "scrape_errors", "observation_problems", "cycle_duration_seconds", "cycle_seconds",
    "last_successful_cycle_timestamp_seconds", "cycles", "cycles_skipped",
    "request_length_cv", "prefix_cache_hit_ratio", "arrival_cv", "kv_batch_limit",
]  # fmt: skip


@pytest.fixture
def fleet() -> Iterator[tuple[EmulatedFleet, ManualClock]]:
    clock = ManualClock()
    emulated = EmulatedFleet(
        LLAMA, SERVER, rng=np.random.default_rng(3), arrivals=4.0,
        input_lengths=LengthDist(LengthKind.UNIFORM, 512),
        output_lengths=LengthDist(LengthKind.UNIFORM, 128),
        model_name="llama", replicas=2, clock=clock,
    )  # fmt: skip
    emulated.start(background=False)
    yield emulated, clock
    emulated.stop()


class FleetSource:
    def __init__(self, fleet: EmulatedFleet, *, down: bool = False) -> None:
        self.fleet, self.down = fleet, down

    def read(self) -> SourceRead:
        from exporter.collector.sources import ScrapeSource

        if self.down:
            raise ScrapeError(
                "http://127.0.0.1:1/metrics", "connection refused", reason=FailureReason.CONNECTION
            )
        return ScrapeSource(
            clock=self.fleet.sim_clock, urls=self.fleet.urls, model_name="llama"
        ).read()


def config(initial: ServiceParams | None = LLAMA, state: Path | None = None) -> Config:
    dep = DeploymentConfig(
        name="llama", model_name="llama", source=SourceConfig(scrape_urls=("http://x:1/",)),
        server=SERVER, slo=SloConfig(ttft_ms=60.0, itl_ms=20.0), min_replicas=1,
        max_replicas=8, initial_params=initial,
    )  # fmt: skip
    return Config(cycle_period_s=CYCLE_S, state_file=state, deployments=(dep,))


def cycles(daemon: Daemon, fleet: EmulatedFleet, clock: ManualClock, count: int) -> None:
    for _ in range(count):
        for _ in range(int(CYCLE_S)):
            clock.advance(1.0)
            fleet.sync()
        daemon.run_cycle()


def test_exposition_has_every_metric_in_base_units(fleet) -> None:  # type: ignore[no-untyped-def]
    emulated, clock = fleet
    registry = CollectorRegistry()
    source = FleetSource(emulated)
    daemon = Daemon(config(), {"llama": source}, registry, emulated.sim_clock)
    cycles(daemon, emulated, clock, 8)
    text = generate_latest(registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in EXPORTED:
        assert "vllm_sizer_" + name in families, name
    labels = {"deployment": "llama", "model_name": "llama"}
    alpha = registry.get_sample_value("vllm_sizer_model_alpha_seconds", labels)
    assert alpha is not None and 0.001 < alpha < 0.02  # ms -> s
    ttft = registry.get_sample_value("vllm_sizer_observed_ttft_seconds", labels)
    assert ttft is not None and 0.005 < ttft < 0.2
    assert registry.get_sample_value("vllm_sizer_current_replicas", labels) == 2
    assert registry.get_sample_value("vllm_sizer_slo_ttft_seconds", labels) == pytest.approx(0.06)
    states = [s.labels["state"] for s in families["vllm_sizer_tuner_state"].samples if s.value]
    assert states in (["fitted"], ["holding"])
    # The traffic shape: uniform lengths read narrow, no prefix-cache hits, and the emulator's
    # KV cache holds more than max_num_seqs requests of this shape.
    for kind in ("prompt", "output"):
        cv = registry.get_sample_value("vllm_sizer_request_length_cv", labels | {"kind": kind})
        assert cv is not None and 0.2 < cv < 0.5, kind
    assert registry.get_sample_value("vllm_sizer_prefix_cache_hit_ratio", labels) == 0.0
    limit = registry.get_sample_value("vllm_sizer_kv_batch_limit", labels)
    assert limit == SERVER.max_batch_size
    assert registry.get_sample_value("vllm_sizer_arrival_cv", labels) is None  # no sampler
    # Each tuner point carries the smoothed CVs of its window.
    window = daemon.runtimes["llama"].cycle.tuner.to_dict()["window"]
    assert window and all(0.2 < p["input_length_cv"] < 0.5 for p in window)
    assert all(p["arrival_cv"] is None for p in window)


def test_a_dead_source_is_counted_and_keeps_the_calibration(fleet) -> None:  # type: ignore[no-untyped-def]
    emulated, clock = fleet
    registry = CollectorRegistry()
    source = FleetSource(emulated)
    daemon = Daemon(config(), {"llama": source}, registry, emulated.sim_clock)
    cycles(daemon, emulated, clock, 3)
    before = daemon.runtimes["llama"].cycle.params
    desired = daemon.collector.snapshot.deployments[0].decision.desired_replicas
    source.down = True
    cycles(daemon, emulated, clock, 2)
    labels = {"deployment": "llama", "source": "scrape", "reason": "connection"}
    assert registry.get_sample_value("vllm_sizer_scrape_errors_total", labels) == 2
    status = daemon.collector.snapshot.deployments[0]
    assert status.params == before
    assert status.decision.reason == "source_down"
    assert status.decision.desired_replicas == desired


def test_readyz_turns_unready_when_cycles_stop_succeeding(fleet) -> None:  # type: ignore[no-untyped-def]
    emulated, clock = fleet
    registry = CollectorRegistry()
    source = FleetSource(emulated)
    daemon = Daemon(config(), {"llama": source}, registry, emulated.sim_clock)
    http = SizerHTTPServer("127.0.0.1", 0, registry, daemon.ready, daemon.predict)
    http.start()
    base = f"http://127.0.0.1:{http.port}"
    try:
        assert _status(base + "/readyz") == 503  # no cycle yet
        assert _status(base + "/healthz") == 200
        cycles(daemon, emulated, clock, 2)
        assert _status(base + "/readyz") == 200
        source.down = True
        cycles(daemon, emulated, clock, 2)
        assert _status(base + "/readyz") == 200  # 2 failed periods: within READY_PERIODS
        cycles(daemon, emulated, clock, 2)
        assert _status(base + "/readyz") == 503
        assert _status(base + "/healthz") == 200
    finally:
        http.stop()


def test_predict_endpoint(fleet) -> None:  # type: ignore[no-untyped-def]
    emulated, clock = fleet
    registry = CollectorRegistry()
    daemon = Daemon(config(), {"llama": FleetSource(emulated)}, registry, emulated.sim_clock)
    http = SizerHTTPServer("127.0.0.1", 0, registry, daemon.ready, daemon.predict)
    http.start()
    base = f"http://127.0.0.1:{http.port}/api/v1/predict"
    try:
        assert _status(base + "?deployment=llama&rate=5") == 404  # no request shape yet
        cycles(daemon, emulated, clock, 2)
        with urlopen(base + "?deployment=llama&rate=12&replicas=3") as resp:
            body = json.loads(resp.read())
        assert body["replicas"] == 3
        assert body["per_replica_rate_requests_per_second"] == pytest.approx(4.0)
        assert 0.005 < body["ttft_seconds"] < 0.2 and body["replicas_needed"] >= 1
        for query, parameter in (
            ("deployment=llama", "rate"),
            ("deployment=llama&rate=-1", "rate"),
            ("deployment=llama&rate=abc", "rate"),
            ("deployment=llama&rate=1&replicas=0", "replicas"),
            ("rate=1", "deployment"),
            ("deployment=llama&rate=1&colour=red", "colour"),
        ):
            err = _error(base + "?" + query)
            assert err[0] == 400 and err[1]["parameter"] == parameter, query
        assert _error(base + "?deployment=nope&rate=1")[0] == 404
    finally:
        http.stop()


def test_restart_restores_the_calibration(fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    emulated, clock = fleet
    state = tmp_path / "state.json"
    first = Daemon(config(state=state), {"llama": FleetSource(emulated)},
                   CollectorRegistry(), emulated.sim_clock, StateFile(state))  # fmt: skip
    for rate in (2.0, 8.0, 4.0, 12.0, 6.0, 16.0):
        emulated.set_rate_rps(rate)
        cycles(first, emulated, clock, 2)  # the second window at each load is steady
    tuner = first.runtimes["llama"].cycle.tuner
    assert tuner.params is not None and len(tuner.window) >= 5
    # The restarted daemon has no initial parameters: what it knows comes from the state file.
    registry = CollectorRegistry()
    second = Daemon(config(initial=None, state=state), {"llama": FleetSource(emulated)},
                    registry, emulated.sim_clock, StateFile(state))  # fmt: skip
    restored = second.runtimes["llama"].cycle
    assert restored.params == tuner.params  # before any cycle
    assert restored.tuner.window == tuner.window
    assert restored.workload == first.runtimes["llama"].cycle.workload
    cycles(second, emulated, clock, 1)
    labels = {"deployment": "llama", "model_name": "llama"}
    alpha = registry.get_sample_value("vllm_sizer_model_alpha_seconds", labels)
    assert alpha is not None and math.isclose(alpha, restored.params.alpha_ms / 1000.0, rel_tol=0.2)


def _status(url: str) -> int:
    try:
        with urlopen(url) as resp:
            return int(resp.status)
    except HTTPError as exc:
        return int(exc.code)


def _error(url: str) -> tuple[int, dict[str, str]]:
    try:
        with urlopen(url) as resp:
            return int(resp.status), json.loads(resp.read())
    except HTTPError as exc:
        return int(exc.code), json.loads(exc.read())


def test_a_changed_configuration_reseeds_from_the_saved_estimate(fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    emulated, clock = fleet
    state = tmp_path / "state.json"
    first = Daemon(config(state=state), {"llama": FleetSource(emulated)},
                   CollectorRegistry(), emulated.sim_clock, StateFile(state))  # fmt: skip
    cycles(first, emulated, clock, 2)
    saved = first.runtimes["llama"].cycle.params
    changed = replace(config(initial=None, state=state).deployments[0], tuner=TunerConfig(5, 20))
    second = Daemon(replace(config(state=state), deployments=(changed,)),
                    {"llama": FleetSource(emulated)}, CollectorRegistry(), emulated.sim_clock,
                    StateFile(state))  # fmt: skip
    tuner = second.runtimes["llama"].cycle.tuner
    assert tuner.window_size == 20 and tuner.params == saved


class HistoryFleetSource(FleetSource):
    """The emulated fleet plus a remembered past read, as Prometheus can give."""

    def __init__(self, fleet: EmulatedFleet, past: SourceRead) -> None:
        super().__init__(fleet)
        self.past = past
        self.asked: list[float] = []

    def read_at(self, time_s: float) -> SourceRead:
        self.asked.append(time_s)
        return self.past


def test_a_source_with_history_gives_a_window_on_the_first_cycle(fleet) -> None:  # type: ignore[no-untyped-def]
    emulated, clock = fleet
    for _ in range(int(CYCLE_S)):
        clock.advance(1.0)
        emulated.sync()
    past = FleetSource(emulated).read()
    source = HistoryFleetSource(emulated, past)
    daemon = Daemon(config(), {"llama": source}, CollectorRegistry(), emulated.sim_clock)
    for _ in range(int(CYCLE_S)):
        clock.advance(1.0)
        emulated.sync()
    status = daemon.run_cycle().deployments[0]
    assert source.asked == [pytest.approx(emulated.sim_clock.time() - CYCLE_S)]
    assert status.decision.reason != "first_window" and status.observed_ttft_ms is not None
    daemon.run_cycle()
    assert len(source.asked) == 1  # only before the first read


def test_a_recovery_from_a_change_ends_while_pods_churn(fleet) -> None:  # type: ignore[no-untyped-def]
    # A detected change lowers the confidence until the tuner has seen `min_observations`
    # cycles since. Windows in which pods come or go feed the tuner the pods that served
    # through them; a hand-over that churned pods every window (the in-flight count once
    # did) must not keep the confidence low.
    emulated, clock = fleet
    daemon = Daemon(config(), {"llama": FleetSource(emulated)}, CollectorRegistry(),
                    emulated.sim_clock)  # fmt: skip
    for rate in (2.0, 6.0, 4.0, 8.0, 3.0, 7.0, 5.0):
        emulated.set_rate_rps(rate)
        cycles(daemon, emulated, clock, 2)  # the second window at each load is steady
    tuner = daemon.runtimes["llama"].cycle.tuner
    assert tuner.fit_count > 0 and tuner.to_dict()["since_change"] is None
    # The deployment slows by half: every metric 1.5x the last points'.
    for point in list(tuner.window)[-4:]:
        tuner.update(replace(point, ttft_ms=1.5 * point.ttft_ms, itl_ms=1.5 * point.itl_ms))
    assert tuner.to_dict()["since_change"] is not None
    settle, fits = config().deployments[0].tuner.min_observations, tuner.fit_count
    low = tuner.confidence()
    assert low < 0.5  # the hand-over
    # The real points differ from the slowed ones, so the tuner sees a change back, and
    # recovers from that one too with pods coming and going every window.
    seen = []
    for k in range(3 * settle):
        emulated.set_replicas(3 if k % 2 == 0 else 2)
        cycles(daemon, emulated, clock, 1)
        seen.append(round(tuner.confidence(), 2))
    assert tuner.fit_count > fits  # the churned windows still reach the tuner
    # The recovery ends: the change no longer holds the confidence down (what remains is what
    # the points since the change identify, docs/concepts/confidence.md).
    assert tuner.to_dict()["since_change"] >= settle
    assert len(set(seen[-settle:])) == 1, seen  # no longer rising from the change
