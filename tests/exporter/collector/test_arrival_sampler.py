"""The sidecar's 1 s arrival sampler: the arrival CV of emulated Poisson and gamma traffic over
10 windows, no CV (a counted problem) after a gap, a vanished pod or a counter reset, and a
thread that samples on its own, holding no more than a read buffer of an endless body."""

from __future__ import annotations

import time

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from exporter.base.clock import ManualClock, SystemClock
from exporter.collector.arrival_sampler import (
    ArrivalSampler,
    CounterSample,
    build_samplers,
    is_loopback,
    read_window,
)
from exporter.collector.observations import observe_deployment
from exporter.collector.pod_observation import Problem
from exporter.collector.sources import ScrapeSource, SourceRead
from exporter.config.values import Config, DeploymentConfig, SloConfig, SourceConfig
from exporter.daemon.daemon import Daemon
from exporter.sizing.traffic import TrafficTracker
from exporter.testbed.emulator import EmulatedFleet
from model import ServerConfig, ServiceParams, Workload
from model.queueing.analyzer import max_rate
from model.simulation.workloads import LengthDist, LengthKind
from tests.fixtures.memory import peak_traced_mib
from tests.fixtures.metrics_server import Behaviour, MetricsServer
from tests.fixtures.vllm_exposition import PodTotals, render
from tests.reliability.fault_server import Fault, FaultServer

LLAMA = ServiceParams(6.68, 2.01e-2, 5.52e-5)
SERVER = ServerConfig(256, 8192)
SHAPE = Workload(1024, 256)
WINDOW_S = 30
WINDOWS = 10


def emulated_arrival_cv(interarrival_cv: float, seed: int) -> float | None:
    """One emulated replica at 30 % load, sampled every simulated second over loopback for 10
    windows of 30 s; the tracker's smoothed arrival CV."""
    clock = ManualClock()
    fleet = EmulatedFleet(
        LLAMA, SERVER, rng=np.random.default_rng(seed),
        arrivals=0.3 * max_rate(LLAMA, SERVER, SHAPE), interarrival_cv=interarrival_cv,
        input_lengths=LengthDist(LengthKind.UNIFORM, SHAPE.avg_input_tokens),
        output_lengths=LengthDist(LengthKind.UNIFORM, SHAPE.avg_output_tokens),
        model_name="m", replicas=1, clock=clock,
    )  # fmt: skip
    fleet.start(background=False)
    try:
        sampler = ArrivalSampler(fleet.urls[0], clock=fleet.sim_clock, model_name="m")
        tracker = TrafficTracker()
        windows = []
        for _ in range(20):  # warm up
            clock.advance(1.0)
            fleet.sync()
        for _ in range(WINDOWS):
            start_s = fleet.sim_clock.time()
            sampler.sample_once()
            for _ in range(WINDOW_S):
                clock.advance(1.0)
                fleet.sync()
                sampler.sample_once()
            reading = sampler.reading(start_s, fleet.sim_clock.time())
            assert reading.problem is None and reading.index is not None
            windows.append((reading.index, reading.requests))
    finally:
        fleet.stop()
    # Only the arrival CV is smoothed here: the windows' observations add nothing else.
    no_pods = observe_deployment(SourceRead(0.0, ()), SourceRead(1.0, ()))
    for dispersion in windows:
        tracker.update(no_pods, dispersion)
    return tracker.shape.arrival_cv


@pytest.mark.parametrize("seed", [1])
def test_poisson_arrivals_read_within_20_percent_of_1(seed: int) -> None:
    cv = emulated_arrival_cv(1.0, seed)
    assert cv is not None and 0.8 <= cv <= 1.2


@pytest.mark.parametrize("seed", [1])
def test_gamma_cv_2_arrivals_read_at_least_1_5(seed: int) -> None:
    cv = emulated_arrival_cv(2.0, seed)
    assert cv is not None and cv >= 1.5


def samples(counts: list[float | None], start: float = 1000.0) -> list[CounterSample]:
    return [CounterSample(float(k), c, start) for k, c in enumerate(counts)]


def test_a_failed_fetch_or_a_missing_stretch_gives_no_cv() -> None:
    steady = [float(5 * k) for k in range(31)]
    assert read_window(samples(steady), 0.0, 30.0, 1.0).index == pytest.approx(0.0)
    failed = steady[:10] + [None] + steady[11:]
    assert read_window(samples(failed), 0.0, 30.0, 1.0).problem is Problem.SAMPLER_GAP
    vanished = samples(steady)[:20]  # the pod stopped answering (no samples at all after)
    reading = read_window(vanished, 0.0, 30.0, 1.0)
    assert reading.index is None and reading.problem is Problem.SAMPLER_GAP
    hole = samples(steady)[:10] + samples(steady)[13:]
    assert read_window(hole, 0.0, 30.0, 1.0).problem is Problem.SAMPLER_GAP


def test_a_counter_reset_gives_no_cv() -> None:
    fell = [float(5 * k) for k in range(15)] + [float(k) for k in range(16)]
    reading = read_window(samples(fell), 0.0, 30.0, 1.0)
    assert reading.index is None and reading.problem is Problem.COUNTER_RESET
    # A restart that happens to leave the counter higher: the process start time tells.
    grew = samples([float(5 * k) for k in range(31)])
    restarted = grew[:15] + [CounterSample(s.time_s, s.count, 2000.0) for s in grew[15:]]
    assert read_window(restarted, 0.0, 30.0, 1.0).problem is Problem.COUNTER_RESET


def test_an_idle_window_is_no_problem_and_no_cv() -> None:
    reading = read_window(samples([3.0] * 31), 0.0, 30.0, 1.0)
    assert reading.index is None and reading.problem is None


def test_the_thread_samples_on_its_own_and_a_dead_pod_is_a_gap() -> None:
    with MetricsServer(lambda: render(PodTotals(success=3, ttft_count=3))) as pod:
        sampler = ArrivalSampler(pod.url, clock=SystemClock(), period_s=0.1, deadline_s=0.05)
        start_s = time.time()
        sampler.start()
        time.sleep(1.0)
        pod.behaviour = Behaviour.FAIL
        time.sleep(0.3)
        sampler.stop()
        end_s = time.time()
    assert sampler.reading(start_s + 0.2, start_s + 0.9).problem is None
    assert sampler.reading(start_s + 0.2, end_s).problem is Problem.SAMPLER_GAP


def test_only_a_single_loopback_url_gets_a_sampler() -> None:
    assert is_loopback("http://127.0.0.1:8000/metrics") and is_loopback("http://localhost/m")
    assert not is_loopback("http://10.0.0.7:8000/metrics")

    def dep(name: str, *urls: str) -> DeploymentConfig:
        return DeploymentConfig(
            name=name, model_name="m", source=SourceConfig(scrape_urls=urls),
            server=SERVER, slo=SloConfig(ttft_ms=100.0),
        )  # fmt: skip

    deps = [
        dep("sidecar", "http://127.0.0.1:8000/metrics"),
        dep("remote", "http://10.0.0.7:8000/metrics"),
        dep("two", "http://127.0.0.1:8000/metrics", "http://127.0.0.1:8001/metrics"),
    ]
    assert list(build_samplers(deps, SystemClock())) == ["sidecar"]


def test_the_daemon_counts_a_sampler_gap_and_exports_a_measured_cv() -> None:
    clock = ManualClock()
    fleet = EmulatedFleet(
        LLAMA, SERVER, rng=np.random.default_rng(5), arrivals=4.0, model_name="m",
        replicas=1, clock=clock,
    )  # fmt: skip
    fleet.start(background=False)
    try:
        url = fleet.urls[0]
        dep = DeploymentConfig(
            name="d", model_name="m", source=SourceConfig(scrape_urls=(url,)), server=SERVER,
            slo=SloConfig(ttft_ms=100.0),
        )  # fmt: skip
        sampler = ArrivalSampler(url, clock=fleet.sim_clock, model_name="m")
        registry = CollectorRegistry()
        source = ScrapeSource(clock=fleet.sim_clock, urls=(url,), model_name="m")
        daemon = Daemon(
            Config(cycle_period_s=WINDOW_S, deployments=(dep,)), {"d": source}, registry,
            fleet.sim_clock, samplers={"d": sampler},
        )  # fmt: skip
        labels = {"deployment": "d", "model_name": "m"}
        for cycle in range(4):
            sampler.sample_once()
            for second in range(WINDOW_S):
                clock.advance(1.0)
                fleet.sync()
                if not (cycle == 2 and second == 10):  # one missed sample in the third window
                    sampler.sample_once()
            daemon.run_cycle()
        gaps = registry.get_sample_value(
            "vllm_sizer_observation_problems_total", {"deployment": "d", "problem": "sampler_gap"}
        )
        assert gaps == 1
        cv = registry.get_sample_value("vllm_sizer_arrival_cv", labels)
        assert cv is not None and 0.5 < cv < 1.6
    finally:
        daemon.close()
        fleet.stop()


def test_a_sample_of_an_endless_body_holds_no_more_than_a_read_buffer() -> None:
    """The sampler's thread lives as long as the daemon: a whole 32 MiB body read on it once
    kept about 30 MB of its malloc arena for good, per sampled pod that ever sent one."""
    with FaultServer(Fault.HUGE, max_seconds=30.0) as server:
        sampler = ArrivalSampler(server.url, clock=SystemClock(), period_s=5.0, deadline_s=5.0)
        sample, peak_mib = peak_traced_mib(sampler.sample_once)
    assert sample.count is None  # cut off at the cap or the deadline
    assert peak_mib < 1, peak_mib


def test_the_sampler_keeps_to_the_configured_response_cap() -> None:
    """A body over `max_response_mib` is refused by the sampler too (it used the default)."""
    body = "vllm:num_requests_running 0\n" + "# padding\n" * 150_000  # about 1.5 MiB
    with FaultServer(Fault.SERVE, (body,)) as server:
        deps = [
            DeploymentConfig(
                name="sidecar", model_name="m", source=SourceConfig(scrape_urls=(server.url,)),
                server=SERVER, slo=SloConfig(ttft_ms=100.0),
            )
        ]  # fmt: skip
        capped = build_samplers(deps, SystemClock(), max_body_bytes=1 << 20)["sidecar"]
        roomy = build_samplers(deps, SystemClock(), max_body_bytes=4 << 20)["sidecar"]
        assert capped._read(0.0) == f"body larger than {1 << 20} bytes"
        assert "larger than" not in str(roomy._read(0.0))  # read whole: no counter in it
