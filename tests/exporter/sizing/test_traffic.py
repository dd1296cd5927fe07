"""Traffic shape: length CVs read from the emulator's vLLM histograms and smoothed, the prefix
cache and KV capacity carried, config pins, and what sizing is evaluated with."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from exporter.base.clock import ManualClock
from exporter.collector.observations import DeploymentObservation, WindowTracker
from exporter.collector.sources import ScrapeSource, SourceRead
from exporter.collector.vllm_metrics import (
    CounterName,
    GaugeName,
    HistogramName,
    HistogramTotals,
    PodSample,
    SampleStatus,
)
from exporter.config.values import Config, DeploymentConfig, SloConfig, SourceConfig
from exporter.daemon.daemon import Daemon
from exporter.sizing.traffic import (
    LengthCvKind,
    TrafficShape,
    TrafficTracker,
    model_inputs,
    used_cvs,
)
from exporter.testbed.emulator import EmulatedFleet
from model import ModelOptions, ServerConfig, ServiceParams, Workload, analyze
from model.queueing.analyzer import max_rate
from model.queueing.kv_limit import kv_batch_limit, mean_running_context_tokens
from model.queueing.sizing import max_rate_for_slo
from model.simulation.workloads import LengthDist, LengthKind, LengthPairs

LLAMA = ServiceParams(6.68, 2.01e-2, 5.52e-5)
SERVER = ServerConfig(256, 8192)
SHAPE = Workload(1024, 256)
WINDOW_S = 30
WINDOWS = 12


@dataclass(frozen=True)
class Run:
    observations: list[DeploymentObservation]
    shapes: list[TrafficShape]


def emulate(
    kind: LengthKind,
    cv: float,
    *,
    shape: Workload = SHAPE,
    load: float = 0.5,
    replicas: int = 2,
    seed: int = 7,
    warm_up_s: int = 30,
    windows_read: int = WINDOWS,
) -> Run:
    """Emulated replicas (two by default) at `load` of their saturation rate, scraped over
    loopback every 30 simulated seconds after `warm_up_s`; each window's observation and the
    smoothed shape after it."""
    clock = ManualClock()
    rate = load * max_rate(LLAMA, SERVER, shape)
    fleet = EmulatedFleet(
        LLAMA, SERVER, rng=np.random.default_rng(seed), arrivals=replicas * rate,
        input_lengths=LengthDist(kind, shape.avg_input_tokens, cv),
        output_lengths=LengthDist(kind, shape.avg_output_tokens, cv),
        model_name="m", replicas=replicas, clock=clock,
    )  # fmt: skip
    fleet.start(background=False)

    def advance(seconds: int) -> None:
        for _ in range(seconds):
            clock.advance(1.0)
            fleet.sync()

    try:
        advance(warm_up_s)
        source = ScrapeSource(clock=fleet.sim_clock, urls=fleet.urls, model_name="m")
        windows, traffic = WindowTracker(), TrafficTracker()
        windows.observe(source.read())
        observations, shapes = [], []
        for _ in range(windows_read):
            advance(WINDOW_S)
            obs = windows.observe(source.read())
            observations.append(obs)
            shapes.append(traffic.update(obs))
    finally:
        fleet.stop()
    return Run(observations, shapes)


@pytest.fixture(scope="module")
def lognormal_run() -> Run:
    return emulate(LengthKind.LOGNORMAL, 1.0)


@pytest.fixture(scope="module")
def uniform_run() -> Run:
    return emulate(LengthKind.UNIFORM, 0.0)


def test_lognormal_cv_1_reads_within_25_percent_from_the_emulator_histograms(
    lognormal_run: Run,
) -> None:
    for shape in lognormal_run.shapes[2:]:
        for kind in LengthCvKind:
            cv = shape.length_cv(kind)
            assert cv is not None and 0.75 <= cv <= 1.25, (kind, cv)
    # Each window alone (about 600 requests) is noisier but still wide.
    assert all(obs.windows for obs in lognormal_run.observations)


def test_uniform_lengths_read_narrow(uniform_run: Run) -> None:
    for shape in uniform_run.shapes:
        for kind in LengthCvKind:
            cv = shape.length_cv(kind)
            assert cv is not None and cv < 0.5, (kind, cv)


@pytest.mark.parametrize("run_name", ["uniform_run", "lognormal_run"])
def test_smoothed_cvs_move_the_slo_capacity_less_than_5_percent_per_cycle(
    run_name: str, request: pytest.FixtureRequest
) -> None:
    # At the shape's true means, so that only the measured CVs move the capacity: the target
    # is twice the light-load TTFT. (The window means move it too: see
    # docs/validation/traffic-shape.md.)
    run: Run = request.getfixturevalue(run_name)
    dep = deployment()
    target = 2.0 * float(analyze(LLAMA, SERVER, SHAPE, 0.01).ttft_ms)
    capacities = []
    for shape in run.shapes[2:]:
        inputs = model_inputs(dep, shape, SHAPE)
        assert inputs.options.input_length_cv == shape.input_length_cv
        capacities.append(
            max_rate_for_slo(LLAMA, inputs.server, SHAPE, target, options=inputs.options).rate_rps
        )
    caps = np.array(capacities)
    assert np.max(np.abs(np.diff(caps)) / caps[:-1]) < 0.05


def deployment(**model: float) -> DeploymentConfig:
    return DeploymentConfig(
        name="d", model_name="m", source=SourceConfig(scrape_urls=("u",)), server=SERVER,
        slo=SloConfig(ttft_ms=100.0), model=ModelOptions(**model),  # type: ignore[arg-type]
        pinned_inputs=frozenset(model),
    )  # fmt: skip


def test_a_config_value_pins_a_cv() -> None:
    shape = TrafficShape(input_length_cv=1.2, output_length_cv=0.9, arrival_cv=2.0)
    pinned = deployment(output_length_cv=0.0, arrival_cv=1.0)
    assert used_cvs(pinned, shape) == {"input_length_cv": 1.2}
    options = model_inputs(pinned, shape, SHAPE).options
    assert (options.input_length_cv, options.output_length_cv, options.arrival_cv) == (
        1.2, 0.0, 1.0,
    )  # fmt: skip
    free = model_inputs(deployment(), shape, SHAPE).options
    assert (free.input_length_cv, free.output_length_cv, free.arrival_cv) == (1.2, 0.9, 2.0)


def test_the_kv_cache_lowers_the_batch_sizing_uses() -> None:
    context = mean_running_context_tokens(SHAPE, 1.0)
    assert context == 1024 + (256 * 2 + 1) / 2
    shape = TrafficShape(output_length_cv=1.0, kv_capacity_tokens=100 * context)
    inputs = model_inputs(deployment(), shape, SHAPE)
    assert inputs.server.max_batch_size == inputs.kv_batch_limit == 100
    # A cache that holds more than max_num_seqs leaves the limit at max_num_seqs.
    roomy = model_inputs(deployment(), replace(shape, kv_capacity_tokens=1e9), SHAPE)
    assert roomy.server.max_batch_size == roomy.kv_batch_limit == SERVER.max_batch_size
    # Unknown capacity or request shape: the configured server, no limit.
    assert model_inputs(deployment(), TrafficShape(), SHAPE).kv_batch_limit is None
    assert model_inputs(deployment(), shape, None).server == SERVER
    assert kv_batch_limit(10.0, SHAPE, 256) == 1  # never below one request
    # Fewer slots: the sizing capacity falls.
    target = 2.0 * float(analyze(LLAMA, SERVER, SHAPE, 0.01).ttft_ms)
    small = model_inputs(deployment(), replace(shape, kv_capacity_tokens=20 * context), SHAPE)
    assert (
        max_rate_for_slo(LLAMA, small.server, SHAPE, target).rate_rps
        < max_rate_for_slo(LLAMA, SERVER, SHAPE, target).rate_rps
    )


def test_the_tracker_weights_windows_by_requests_and_keeps_ten(lognormal_run: Run) -> None:
    obs = lognormal_run.observations[0]
    tracker = TrafficTracker(windows=2)
    first = tracker.update(replace(obs, cached_prompt_ratio=0.5))
    assert first.cached_prompt_ratio == 0.5
    assert first.kv_capacity_tokens == obs.kv_capacity_tokens is not None
    # A window with 3x the requests weighs 3x; the third window pushes out the first.
    tripled = replace(obs, completion_rate_rps=3 * obs.completion_rate_rps, cached_prompt_ratio=0.1)
    assert tracker.update(tripled).cached_prompt_ratio == pytest.approx((0.5 + 3 * 0.1) / 4)
    assert tracker.update(tripled).cached_prompt_ratio == pytest.approx(0.1)
    # Arrival CV: the square root of the request-weighted index of dispersion.
    assert tracker.update(obs, (4.0, 100.0)).arrival_cv == pytest.approx(2.0)
    assert tracker.update(obs, (1.0, 300.0)).arrival_cv == pytest.approx(np.sqrt(7 / 4))


def test_the_emulator_reports_cached_prompt_tokens_and_the_collector_reads_the_share() -> None:
    clock = ManualClock()
    fleet = EmulatedFleet(
        LLAMA, SERVER, rng=np.random.default_rng(9), arrivals=4.0, prefix_hit_share=0.5,
        input_lengths=LengthDist(LengthKind.UNIFORM, 1000),
        pairs=LengthPairs(np.array([1000, 3000]), np.array([50, 10])), model_name="m",
        clock=clock,
    )  # fmt: skip
    fleet.start(background=False)
    try:
        source = ScrapeSource(clock=fleet.sim_clock, urls=fleet.urls, model_name="m")
        windows, traffic = WindowTracker(), TrafficTracker()
        windows.observe(source.read())
        for _ in range(60):
            clock.advance(1.0)
            fleet.sync()
        obs = windows.observe(source.read())
        shape = traffic.update(obs)
    finally:
        fleet.stop()
    # Half of every prompt hit the cache: prompt_tokens_cached over prompt_tokens.
    assert obs.cached_prompt_ratio == pytest.approx(0.5, abs=1e-3)
    assert shape.cached_prompt_ratio == obs.cached_prompt_ratio
    # The recorded pairs, not the --lengths law: every output is 50 or 10 tokens.
    generation = obs.windows[HistogramName.GENERATION_LEN]
    assert generation.share_at_most(50.0) == 1.0 and generation.share_at_most(5.0) == 0.0


class PreemptingSource:
    """One pod at a steady load with model-exact latencies; preempts in window `preempt_at`."""

    def __init__(self, clock: ManualClock, preempt_at: int) -> None:
        self.clock, self.preempt_at, self.window = clock, preempt_at, 0
        self.totals = dict.fromkeys(("done", "ttft_s", "gaps", "itl_s", "preempted"), 0.0)

    def advance(self) -> None:
        rate = 0.4 * max_rate(LLAMA, SERVER, SHAPE)
        at = analyze(LLAMA, SERVER, SHAPE, rate)
        done = rate * WINDOW_S
        gaps = done * (SHAPE.avg_output_tokens - 1)
        self.totals["done"] += done
        self.totals["ttft_s"] += done * float(at.ttft_ms) / 1e3
        self.totals["gaps"] += gaps
        self.totals["itl_s"] += gaps * float(at.itl_ms) / 1e3
        self.totals["preempted"] += 3.0 if self.window == self.preempt_at else 0.0
        self.window += 1

    def read(self) -> SourceRead:
        t = self.totals
        n, m = SHAPE.avg_input_tokens, SHAPE.avg_output_tokens
        sample = PodSample(
            pod="p", time_s=self.clock.time(), status=SampleStatus.OK,
            counters={
                CounterName.REQUEST_SUCCESS: t["done"],
                CounterName.PREEMPTIONS: t["preempted"],
            },
            histograms={
                HistogramName.TTFT_S: HistogramTotals(t["ttft_s"], t["done"]),
                HistogramName.ITL_S: HistogramTotals(t["itl_s"], t["gaps"]),
                HistogramName.PROMPT_LEN: HistogramTotals(n * t["done"], t["done"]),
                HistogramName.GENERATION_LEN: HistogramTotals(m * t["done"], t["done"]),
            },
            gauges={GaugeName.RUNNING: 10.0, GaugeName.WAITING: 0.0},
        )  # fmt: skip
        return SourceRead(time_s=self.clock.time(), samples=(sample,))


def run_preempting(preempt_at: int) -> tuple[list[bool | None], int]:
    """Six cycles over a source that preempts in window `preempt_at`: the saturated flag of
    each cycle and the tuner's window length at the end."""
    clock = ManualClock(1000.0)
    source = PreemptingSource(clock, preempt_at=preempt_at)
    dep = replace(deployment(), initial_params=LLAMA)
    daemon = Daemon(Config(cycle_period_s=WINDOW_S, deployments=(dep,)), {"d": source},
                    CollectorRegistry(), clock)  # fmt: skip
    try:
        flags = []
        for _ in range(6):
            daemon.run_cycle()
            flags.append(daemon.collector.snapshot.deployments[0].saturated)
            source.advance()
            clock.advance(WINDOW_S)
        return flags, len(daemon.runtimes["d"].cycle.tuner.to_dict()["window"])
    finally:
        daemon.close()


def test_a_window_with_preemptions_is_saturated_and_not_fitted() -> None:
    # Cycle k closes window k - 1; window 3 preempted: cycle 4 says saturated, and its point
    # stays out of the tuner's window.
    flags, fitted = run_preempting(preempt_at=3)
    assert flags[4] is True and not any(flags[1:4]) and flags[5] is False
    calm_flags, calm_fitted = run_preempting(preempt_at=-1)
    assert not any(calm_flags[1:])
    assert fitted == calm_fitted - 1
