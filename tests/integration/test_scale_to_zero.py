"""Scale to zero and back, end to end: emulated vLLM replicas and a stand-in router behind a
real Prometheus server (Debian's, on loopback), the daemon in central mode reading both through
its Prometheus client, and the test playing KEDA (it applies each recommendation to the fleet).

The router stand-in exports `router_requests_total`, the count of requests the fleet has been
offered, whether or not a replica exists (at zero they wait in the fleet's pending queue, as
at a router holding them). The test checks, cycle by cycle, in real time:
- never 0 while requests run, wait or arrive;
- 1 -> 0 only once `idle_s` has passed since the last request and the demand read 0;
- at zero, and after a restart at zero (state file), 0 stays;
- 0 -> >= 1 in the first cycle after Prometheus has a demand above 0, sized with the calibration
  kept from before (parameters and tuner window unchanged), and serving again afterwards;
- the dashboard's demand panel query returns the daemon's demand from Prometheus.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from prometheus_client import CollectorRegistry, start_http_server

from exporter.base.clock import SystemClock
from exporter.collector.demand import DemandSource
from exporter.collector.promapi import PrometheusClient
from exporter.collector.sources import PrometheusSource
from exporter.config.values import (
    Config,
    DeploymentConfig,
    PrometheusConfig,
    ScaleFromZeroConfig,
    SloConfig,
    SourceConfig,
    TunerConfig,
)
from exporter.daemon.daemon import Daemon
from exporter.daemon.exposition import DeploymentStatus
from exporter.daemon.statefile import StateFile
from exporter.sizing.reasons import Reason
from exporter.testbed.emulator import EmulatedFleet
from model import ServerConfig, ServiceParams, Workload, replicas_for_slo
from model.simulation.workloads import LengthDist, LengthKind
from tests.ecosystem.dashboard import panel_queries
from tests.fixtures.metrics_server import MetricsServer
from tests.integration.prometheus_server import JOB, PrometheusServer, StartPrometheus, Target

pytestmark = pytest.mark.integration

LLAMA = ServiceParams(6.68, 2.01e-2, 5.52e-5)
SERVER = ServerConfig()
SHAPE = Workload(256, 32)  # short requests: a few hundred ms each, so the pods drain quickly
SLO = SloConfig(ttft_ms=60.0, itl_ms=25.0)
RATE_RPS = 4.0
IDLE_S = 6.0
PERIOD_S = 1.5  # one cycle every PERIOD_S of wall time, run by the test
SCRAPE_S = 0.25
DEMAND = "sum(rate(router_requests_total[2s]))"
DEPLOYMENT = "llama"


@dataclass
class Stack:
    fleet: EmulatedFleet
    prom: PrometheusServer
    router: MetricsServer
    daemon_target: str
    work: Path
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    replicas: int = 1  # as KEDA last set them
    scraped: list[str] = field(default_factory=list)  # the pods' URLs Prometheus scrapes

    def targets(self) -> list[Target]:
        pods = [Target(url, {"vllm": "true"}) for url in self.fleet.urls]
        return [*pods, Target(self.router.url), Target(self.daemon_target)]

    def config(self) -> Config:
        dep = DeploymentConfig(
            name=DEPLOYMENT, model_name="llama", server=SERVER, slo=SLO,
            source=SourceConfig(prometheus_selector=f'{{job="{JOB}", vllm="true"}}'),
            min_replicas=0, max_replicas=4, scale_down_stabilization_s=0.0,
            initial_params=LLAMA, tuner=TunerConfig(min_observations=3, window=5),
            scale_from_zero=ScaleFromZeroConfig(demand_query=DEMAND, idle_s=IDLE_S),
        )  # fmt: skip
        return Config(
            cycle_period_s=2.0,
            prometheus=PrometheusConfig(self.prom.base_url, timeout_s=2.0),
            state_file=self.work / "state.json",
            deployments=(dep,),
        )

    def daemon(self, registry: CollectorRegistry) -> Daemon:
        config = self.config()
        client = PrometheusClient(self.prom.base_url, timeout_s=2.0)
        clock = SystemClock()
        source = PrometheusSource(
            client=client, clock=clock, selector=f'job="{JOB}", vllm="true"',
            model_name="llama", pod_label="instance",
        )  # fmt: skip
        assert config.state_file is not None
        return Daemon(
            config, {DEPLOYMENT: source}, registry, clock, StateFile(config.state_file),
            demand={DEPLOYMENT: DemandSource(client=client, query=DEMAND)},
        )  # fmt: skip

    def apply(self, desired: int | None) -> None:
        """KEDA's part: scale the fleet to the recommendation (a replica serves from the next
        emulator tick); Prometheus's targets follow the replicas that serve."""
        if desired is not None and desired != self.replicas:
            self.fleet.set_replicas(desired)
            self.replicas = desired
        self.follow()

    def follow(self) -> None:
        """Point Prometheus at the replicas serving now (file discovery: live)."""
        if self.fleet.urls != self.scraped:
            self.scraped = self.fleet.urls
            self.prom.set_targets(self.targets())

    def in_system(self) -> int:
        """Requests offered and not finished: running, waiting, or held with no replica."""
        return self.fleet.result().in_system

    def demand_now(self) -> float | None:
        response = requests.post(
            f"{self.prom.base_url}/api/v1/query", data={"query": DEMAND}, timeout=5
        )
        result = response.json()["data"]["result"]
        return float(result[0]["value"][1]) if result else None


@pytest.fixture
def stack(start_prometheus: StartPrometheus, tmp_path: Path) -> Iterator[Stack]:
    fleet = EmulatedFleet(
        LLAMA, SERVER, rng=np.random.default_rng(5), arrivals=RATE_RPS,
        input_lengths=LengthDist(LengthKind.UNIFORM, SHAPE.avg_input_tokens),
        output_lengths=LengthDist(LengthKind.UNIFORM, SHAPE.avg_output_tokens),
        model_name="llama", replicas=1,
    )  # fmt: skip

    def router_body() -> str:
        offered = fleet.result().arrived
        return (
            "# HELP router_requests_total Requests received for the model.\n"
            "# TYPE router_requests_total counter\n"
            f'router_requests_total{{model="llama"}} {offered}\n'
        )

    registry = CollectorRegistry()
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    with fleet, MetricsServer(router_body) as router:
        daemon_target = f"http://127.0.0.1:{server.server_port}/metrics"
        pods = [Target(url, {"vllm": "true"}) for url in fleet.urls]
        prom = start_prometheus(
            [*pods, Target(router.url), Target(daemon_target)], scrape_interval_s=SCRAPE_S
        )
        try:
            yield Stack(fleet, prom, router, daemon_target, tmp_path, registry, 1, fleet.urls)
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)


@dataclass
class Cycle:
    at_s: float  # wall time the cycle ran
    desired: int | None
    reason: Reason
    in_system_before: int  # requests not finished when the cycle started
    status: DeploymentStatus


def run(stack: Stack, daemon: Daemon, *, apply: bool = True) -> Cycle:
    """Wait for the next period, run one cycle, and (as KEDA would) apply its count."""
    time.sleep(PERIOD_S)
    before = stack.in_system()
    (status,) = daemon.run_cycle().deployments
    decision = status.decision
    cycle = Cycle(time.time(), decision.desired_replicas, decision.reason, before, status)
    if apply:
        stack.apply(cycle.desired)
    return cycle


def last_activity_s(stack: Stack) -> float:
    """Unix time of the last arrival or completion in the fleet (its simulated clock is wall
    time since start, time_scale 1)."""
    res = stack.fleet.result()
    times = np.concatenate([res.arrival_s, res.finish_s[~np.isnan(res.finish_s)]])
    return stack.fleet.start_unix_s + float(times.max())


def tuner_window(daemon: Daemon) -> Any:
    return daemon.runtimes[DEPLOYMENT].cycle.tuner.to_dict()


def test_to_zero_after_idle_and_back_on_demand(stack: Stack) -> None:
    daemon = stack.daemon(stack.registry)
    cycles: list[Cycle] = []
    try:
        # Serving: warm up until the pods are read and sized.
        for _ in range(40):
            cycles.append(run(stack, daemon))
            if cycles[-1].reason is Reason.AT_TARGET and cycles[-1].status.pods_observed:
                break
        assert cycles[-1].desired == 1, [(c.desired, c.reason) for c in cycles]
        served = len(cycles)
        # The dashboard's demand panel reads the daemon's own gauge back from Prometheus.
        stack.prom.wait_for_scrape(after_s=time.time())
        (panel,) = [q for q in panel_queries() if "vllm_sizer_demand" in q.expr]
        expr = panel.expr.replace('deployment="llama-8b-vllm"', f'deployment="{DEPLOYMENT}"')
        result = requests.post(
            f"{stack.prom.base_url}/api/v1/query", data={"query": expr}, timeout=5
        ).json()["data"]["result"]
        assert [r["metric"] for r in result] == [{"kind": "rate"}]
        assert float(result[0]["value"][1]) > 0
        # Idle: no more requests. 0 comes once idle_s has passed since the last activity and
        # the demand reads 0, never while a request runs, waits or arrives.
        stack.fleet.set_rate_rps(0.0)
        for _ in range(40):
            cycles.append(run(stack, daemon))
            if cycles[-1].desired == 0:
                break
        zero = cycles[-1]
        assert zero.desired == 0 and zero.reason is Reason.SCALED_TO_ZERO
        assert zero.in_system_before == 0
        assert zero.at_s - last_activity_s(stack) >= IDLE_S
        # And not much later: the demand's 2 s window, a few cycles, slack for a busy machine.
        assert zero.at_s - last_activity_s(stack) <= IDLE_S + 2.0 + 4 * PERIOD_S + 4.0
        for cycle in cycles[:-1]:
            assert cycle.desired is None or cycle.desired >= 1, cycle
        assert [c.reason for c in cycles[served:-1]].count(Reason.IDLE) >= IDLE_S / PERIOD_S - 1
        calibration = daemon.runtimes[DEPLOYMENT].cycle.params
        window = tuner_window(daemon)
        # At zero: the pods are gone, 0 stays, the calibration is kept.
        at_zero = [run(stack, daemon) for _ in range(4)]
        assert stack.fleet.urls == []
        assert [(c.desired, c.reason) for c in at_zero] == [(0, Reason.SCALED_TO_ZERO)] * 4
        assert at_zero[-1].status.pods_observed == 0
        assert daemon.ready()  # reading no pod and the demand is a working cycle at zero
        assert daemon.runtimes[DEPLOYMENT].cycle.params == calibration
        assert tuner_window(daemon) == window
        # A restart at zero: the state file says 0 stands, with the same calibration.
        daemon.close()
        daemon = stack.daemon(CollectorRegistry())
        restarted = run(stack, daemon)
        assert (restarted.desired, restarted.reason) == (0, Reason.SCALED_TO_ZERO)
        assert daemon.runtimes[DEPLOYMENT].cycle.params == calibration
        assert tuner_window(daemon) == window
        # Demand: requests wait at the router (no replica). The first cycle after Prometheus
        # has the demand above 0 asks for replicas, sized from the kept calibration.
        stack.fleet.set_rate_rps(RATE_RPS)
        deadline = time.monotonic() + 20
        while not (stack.demand_now() or 0.0) > 0:
            assert time.monotonic() < deadline, "Prometheus never saw the demand"
            time.sleep(0.1)
        (status,) = daemon.run_cycle().deployments
        back = status.decision
        assert back.reason is Reason.DEMAND_FROM_ZERO and back.current_replicas == 0
        assert back.desired_replicas is not None and back.desired_replicas >= 1
        assert back.arrival_rate_rps is not None and back.arrival_rate_rps > 0
        want = replicas_for_slo(
            back.arrival_rate_rps, calibration, SERVER, daemon.runtimes[DEPLOYMENT].cycle.workload,
            SLO.ttft_ms, SLO.itl_ms, options=daemon.config.deployments[0].model,
        ).replicas  # fmt: skip
        assert want is not None and back.desired_replicas >= want  # the bias can only add
        assert daemon.runtimes[DEPLOYMENT].cycle.params == calibration
        assert tuner_window(daemon) == window
        stack.apply(back.desired_replicas)
        # Serving again: the pods are read, and nothing goes to 0 while requests come.
        serving = [run(stack, daemon) for _ in range(6)]
        assert all(c.desired is not None and c.desired >= 1 for c in serving), serving
        assert serving[-1].status.pods_observed >= 1 and serving[-1].status.source_up
    finally:
        daemon.close()
