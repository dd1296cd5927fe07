"""Collector end to end over real HTTP: emulated vLLM replicas, a real Prometheus server.

- The direct scrape of emulated replicas recovers the simulator's own truth over a 60 s window.
- The Prometheus source, reading a real Prometheus that scrapes the same endpoints, gives the
  same observation as the direct scrape (within 5 %), on fake pods with exactly known counters
  and on emulated replicas running in compressed real time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial

import numpy as np
import pytest

from exporter.base.clock import ManualClock, SystemClock
from exporter.collector.observations import (
    DeploymentObservation,
    ObservationStatus,
    observe_deployment,
)
from exporter.collector.pod_observation import Problem
from exporter.collector.promapi import PrometheusClient
from exporter.collector.sources import PrometheusSource, ScrapeSource
from exporter.collector.vllm_metrics import BUCKETED, HistogramName
from exporter.testbed.emulator import EmulatedFleet
from model.queueing.params import ServerConfig, ServiceParams
from model.simulation.workloads import LengthDist, LengthKind
from tests.fixtures.metrics_server import MetricsServer
from tests.fixtures.vllm_exposition import PodTotals, render, steady_increment
from tests.integration.prometheus_server import (
    JOB,
    PrometheusServer,
    StartPrometheus,
    Target,
    prometheus_binary,
)

pytestmark = pytest.mark.integration

LLAMA = ServiceParams(alpha_ms=6.68, beta_ms=2.01e-2, gamma_ms=5.52e-5)
WINDOW_S = 60.0
REL = 0.05
COMPARED = (
    "arrival_rate_rps",
    "completion_rate_rps",
    "avg_input_tokens",
    "avg_output_tokens",
    "ttft_ms",
    "itl_ms",
    "request_tpot_ms",
    "avg_running_per_pod",
)


def assert_same_observation(got: DeploymentObservation, want: DeploymentObservation) -> None:
    assert got.status is want.status is ObservationStatus.OK
    assert [p.pod for p in got.pods] == [p.pod for p in want.pods]
    for name in COMPARED:
        assert getattr(got, name) == pytest.approx(getattr(want, name), rel=REL), name


def test_prometheus_binary_is_installed() -> None:
    # Fails (never skips) without the binary: `make test` installs it via `make prometheus`.
    assert prometheus_binary()


def test_prometheus_server_fixture_scrapes_and_stops(start_prometheus: StartPrometheus) -> None:
    with MetricsServer(lambda: render(PodTotals(success=3))) as pod:
        prom: PrometheusServer = start_prometheus(
            [Target(pod.url, {"pod": "fake-0"})], scrape_interval_s=0.2
        )
        prom.wait_for_scrape(after_s=time.time())
        [sample] = PrometheusClient(prom.base_url).query(
            'sum(vllm:request_success_total{pod="fake-0"})'
        )
        assert sample.value == 3.0
        prom.stop()
        assert not prom.is_ready()


# --- fake pods whose counters grow exactly linearly in wall time ---------------------------


@pytest.fixture
def linear_pods() -> Iterator[list[MetricsServer]]:
    born = time.time()
    per_second = [
        steady_increment(completions=5.0, in_tokens=512, out_tokens=128, ttft_s=0.12,
                         itl_s=0.011, inference_s=1.6, running=8.0, waiting=1.0),
        steady_increment(completions=2.0, in_tokens=1024, out_tokens=64, ttft_s=0.3,
                         itl_s=0.02, inference_s=1.4, running=3.0, waiting=0.0),
    ]  # fmt: skip

    def body(increment: PodTotals) -> str:
        return render(PodTotals().plus(increment, times=time.time() - born), model_name="llama")

    servers = [MetricsServer(partial(body, inc)).start() for inc in per_second]
    yield servers
    for server in servers:
        server.stop()


def test_prometheus_matches_direct_scrape_on_linear_pods(
    start_prometheus: StartPrometheus, linear_pods: list[MetricsServer]
) -> None:
    prom = start_prometheus([s.url for s in linear_pods], scrape_interval_s=0.5)
    prom.wait_for_scrape(after_s=time.time())
    direct = ScrapeSource(
        clock=SystemClock(), urls=[s.url for s in linear_pods], model_name="llama"
    )
    via_prom = PrometheusSource(
        client=PrometheusClient(prom.base_url), clock=SystemClock(), selector=f'job="{JOB}"',
        model_name="llama", pod_label="instance",
    )  # fmt: skip
    start = direct.read()
    # Real time: the pods' counters and Prometheus's scrapes run on it. Prometheus stamps a
    # sample when its scrape starts, the pod computes it when the request is served: on a busy
    # machine that lag is tenths of a second, so the window is long enough to keep it small.
    time.sleep(8.0)
    end = direct.read()
    prom.wait_for_scrape(after_s=end.time_s)
    observed = observe_deployment(start, end)
    from_prom = observe_deployment(via_prom.read_at(start.time_s), via_prom.read_at(end.time_s))
    assert_same_observation(from_prom, observed)
    # Both against the known truth: 7 req/s, count-weighted means, Little's-law occupancy.
    for obs in (observed, from_prom):
        assert obs.completion_rate_rps == pytest.approx(7.0, rel=REL)
        assert obs.ttft_ms == pytest.approx(1000 * (5 * 0.12 + 2 * 0.3) / 7, rel=REL)
        assert obs.avg_input_tokens == pytest.approx((5 * 512 + 2 * 1024) / 7, rel=REL)
        assert obs.avg_running_per_pod == pytest.approx((5 * 1.6 + 2 * 1.4) / 2, rel=REL)
    # A pod that stops answering: its failed scrape writes staleness markers, so Prometheus no
    # longer returns its last values and the deployment has one pod left (spec §7.3.6).
    linear_pods[1].stop()
    stopped_s = time.time()
    prom.wait_for_scrape(after_s=stopped_s, count=1, health="down")
    before = via_prom.read_at(end.time_s)
    after = observe_deployment(before, via_prom.read())
    assert sorted(s.pod for s in before.samples) == sorted(p.target for p in linear_pods)
    assert after.gone_pods == (linear_pods[1].target,)
    assert [p.pod for p in after.pods] == [linear_pods[0].target]


# --- emulated vLLM replicas ----------------------------------------------------------------


def emulated_fleet(clock: ManualClock | None, time_scale: float) -> EmulatedFleet:
    return EmulatedFleet(
        LLAMA, ServerConfig(), rng=np.random.default_rng(2024), arrivals=6.0,
        input_lengths=LengthDist(LengthKind.UNIFORM, 512),
        output_lengths=LengthDist(LengthKind.UNIFORM, 128),
        model_name="llama", replicas=2, time_scale=time_scale, clock=clock,
    )  # fmt: skip


def advance(fleet: EmulatedFleet, clock: ManualClock, seconds: float) -> None:
    for _ in range(int(seconds)):
        clock.advance(1.0)
        fleet.sync()


def test_direct_scrape_recovers_emulator_truth() -> None:
    clock = ManualClock()
    fleet = emulated_fleet(clock, time_scale=1.0)
    fleet.start(background=False)
    try:
        advance(fleet, clock, 30)  # past the ramp-up: a steady window follows
        source = ScrapeSource(clock=fleet.sim_clock, urls=fleet.urls, model_name="llama")
        start, t0 = source.read(), fleet.sim_time_s
        advance(fleet, clock, WINDOW_S)
        end, t1 = source.read(), fleet.sim_time_s
    finally:
        fleet.stop()
    obs = observe_deployment(start, end)
    truth = fleet.truth(t0, t1)
    assert obs.status is ObservationStatus.OK and obs.window_s == pytest.approx(WINDOW_S)
    assert (obs.ready_pods, obs.observed_pods) == (2, 2)
    assert obs.arrival_rate_rps == pytest.approx(truth.arrival_rate_rps, rel=REL)
    assert obs.completion_rate_rps == pytest.approx(truth.throughput_rps, rel=1e-9)
    assert obs.avg_input_tokens == pytest.approx(truth.mean_input_tokens, rel=REL)
    assert obs.avg_output_tokens == pytest.approx(truth.mean_output_tokens, rel=REL)
    assert obs.ttft_ms == pytest.approx(truth.mean_ttft_ms, rel=REL)
    # The emulator's truth is vLLM's per-request TPOT; the token-weighted ITL is close to it.
    assert obs.request_tpot_ms == pytest.approx(truth.mean_itl_ms, rel=REL)
    assert obs.itl_ms == pytest.approx(truth.mean_itl_ms, rel=REL)


def test_prometheus_matches_direct_scrape_on_emulated_replicas(
    start_prometheus: StartPrometheus,
) -> None:
    # The emulator is stepped by hand, so Prometheus and the direct scrape read the very same
    # states (a background emulator on a busy machine lags by a varying fraction of a window).
    # Prometheus stamps samples with its scrape times, which are wall times: the direct read is
    # stamped with the same instants, so both observations cover one window and must agree on
    # every field. The simulator's truth then checks the counts behind them.
    clock = ManualClock()
    fleet = emulated_fleet(clock, time_scale=1.0)
    fleet.start(background=False)
    try:
        advance(fleet, clock, 30)
        prom = start_prometheus(fleet.urls, scrape_interval_s=0.2)
        via_prom = PrometheusSource(
            client=PrometheusClient(prom.base_url), clock=SystemClock(),
            selector=f'job="{JOB}"', model_name="llama", pod_label="instance",
        )  # fmt: skip
        stamp = ManualClock()
        direct = ScrapeSource(clock=stamp, urls=fleet.urls, model_name="llama")
        reads = []
        for step_s in (0.0, WINDOW_S):
            advance(fleet, clock, step_s)
            prom.wait_for_scrape(after_s=time.time())
            prom_read = via_prom.read_at(time.time())
            stamp.advance(min(s.time_s for s in prom_read.samples) - stamp.time())
            reads.append((direct.read(), prom_read))
        t1 = fleet.sim_time_s
    finally:
        fleet.stop()
    observed = observe_deployment(reads[0][0], reads[1][0])
    from_prom = observe_deployment(reads[0][1], reads[1][1])
    assert_same_observation(from_prom, observed)
    truth = fleet.truth(t1 - WINDOW_S, t1)
    completed = sum(p.completed for p in from_prom.pods)
    assert completed == truth.completed
    assert from_prom.avg_output_tokens == pytest.approx(truth.mean_output_tokens, rel=REL)
    assert from_prom.ttft_ms == pytest.approx(truth.mean_ttft_ms, rel=REL)
    assert from_prom.request_tpot_ms == pytest.approx(truth.mean_itl_ms, rel=REL)
    # Buckets come through Prometheus per le (both spellings of the names) exactly as scraped.
    assert set(from_prom.windows) == set(observed.windows) == set(BUCKETED)
    for name, window in observed.windows.items():
        got = from_prom.windows[name]
        assert got.bounds.tolist() == window.bounds.tolist(), name
        assert got.counts.tolist() == window.counts.tolist(), name
    assert from_prom.windows[HistogramName.GENERATION_LEN].count == truth.completed
    assert from_prom.kv_capacity_tokens == observed.kv_capacity_tokens is not None
    assert Problem.BAD_BUCKETS not in from_prom.problems
