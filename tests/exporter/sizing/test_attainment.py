"""Observed attainment from vLLM's histograms: exact at a bucket bound, a bracket between, over
the SLO window; checked by hand and against the simulator's own requests behind an emulator."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from exporter.base.clock import ManualClock
from exporter.collector.observations import WindowTracker
from exporter.collector.sources import ScrapeSource
from exporter.collector.vllm_metrics import HistogramName
from exporter.sizing.attainment import (
    Bound,
    SloWindow,
    attainment_bracket,
    interpolated_share,
)
from exporter.sizing.slo_targets import PredictedPercentile
from exporter.testbed.emulator import EmulatedFleet
from model import LatencyMetric, PercentileTarget, ServerConfig, ServiceParams
from model.calibration.histogram import WindowHistogram
from model.simulation.workloads import LengthDist, LengthKind

LLAMA = ServiceParams(6.68, 2.01e-2, 5.52e-5)
# le = 0.04, 0.06, 0.1 s; 10 observations <= 40 ms, 30 <= 60 ms, 35 <= 100 ms, 40 in all.
HIST = WindowHistogram.from_cumulative([0.04, 0.06, 0.1], [10, 30, 35, 40], sum=2.4, count=40)


def ttft(target_ms: float, q: float = 0.95) -> PercentileTarget:
    return PercentileTarget(LatencyMetric.TTFT, q, target_ms)


@pytest.mark.parametrize(
    ("target_ms", "expected"),
    [
        (60.0, (0.75, 0.75)),  # a bound: exact
        (40.0, (0.25, 0.25)),
        (100.0, (0.875, 0.875)),
        (50.0, (0.25, 0.75)),  # inside (40, 60]: the shares at 40 and at 60 ms
        (20.0, (0.0, 0.25)),  # below the lowest bound
        (150.0, (0.875, 1.0)),  # above the highest finite bound: up to everything
    ],
)
def test_exact_at_a_bound_and_a_bracket_between(
    target_ms: float, expected: tuple[float, float]
) -> None:
    assert attainment_bracket(HIST, target_ms) == expected


@pytest.mark.parametrize(
    ("target_ms", "expected"),
    [
        (60.0, 0.75),  # a bound: exact
        (50.0, 0.5),  # halfway through (40, 60]: halfway between 0.25 and 0.75
        (55.0, 0.625),
        (20.0, 0.125),  # (0, 40]: from 0 at 0 ms
        (150.0, 1.0),  # above the highest finite bound: the bracket's upper end
    ],
)
def test_inside_a_bucket_the_share_is_read_as_histogram_quantile_reads_it(
    target_ms: float, expected: float
) -> None:
    assert interpolated_share(HIST, target_ms) == pytest.approx(expected)


def test_no_observations_no_attainment() -> None:
    empty = WindowHistogram.from_cumulative([0.04], [0, 0], sum=0.0, count=0)
    assert attainment_bracket(empty, 40.0) is None


def test_the_window_adds_the_cycles_within_slo_window_s() -> None:
    window = SloWindow(300.0)
    for k in range(12):  # one 30 s cycle each, ending at 30 ... 360 s
        window.add(30.0 * (k + 1), {HistogramName.TTFT_S: HIST})
    (seen,) = window.attainment([ttft(50.0)])
    assert seen.observations == 10 * 40  # the cycles ending after 60 s: 90 ... 360
    assert (seen.lower, seen.upper) == (0.25, 0.75)
    assert seen.values() == ((Bound.LOWER, 0.25), (Bound.UPPER, 0.75))
    assert window.requests() == 400
    (exact,) = window.attainment([ttft(60.0)])
    assert exact.exact and exact.values() == ((Bound.EXACT, 0.75),)


def test_cycles_with_other_bounds_are_left_out() -> None:
    window = SloWindow(300.0)
    other = WindowHistogram.from_cumulative([0.05, 0.1], [1, 2, 3], sum=0.3, count=3)
    window.add(30.0, {HistogramName.TTFT_S: other})
    window.add(60.0, {HistogramName.TTFT_S: HIST})
    (seen,) = window.attainment([ttft(60.0)])
    assert seen.observations == 40


def test_each_kind_of_target_reads_its_histogram() -> None:
    window = SloWindow(300.0)
    window.add(30.0, {HistogramName.ITL_S: HIST})
    token = PercentileTarget(LatencyMetric.ITL_PER_TOKEN, 0.99, 60.0)
    request = PercentileTarget(LatencyMetric.ITL_PER_REQUEST, 0.99, 60.0)
    (seen,) = window.attainment([ttft(60.0), token, request])
    assert seen.target == token
    assert window.requests() is None


@pytest.fixture
def fleet() -> Iterator[tuple[EmulatedFleet, ManualClock]]:
    clock = ManualClock()
    emulated = EmulatedFleet(
        LLAMA, ServerConfig(256, 8192), rng=np.random.default_rng(5), arrivals=9.0,
        input_lengths=LengthDist(LengthKind.UNIFORM, 1024),
        output_lengths=LengthDist(LengthKind.UNIFORM, 128),
        model_name="llama", replicas=2, clock=clock,
    )  # fmt: skip
    emulated.start(background=False)
    yield emulated, clock
    emulated.stop()


def test_attainment_from_an_emulator_agrees_with_the_simulated_requests(fleet) -> None:  # type: ignore[no-untyped-def]
    emulated, clock = fleet
    source = ScrapeSource(clock=emulated.sim_clock, urls=emulated.urls, model_name="llama")
    tracker, window = WindowTracker("llama"), SloWindow(300.0)
    for _ in range(30):
        clock.advance(1.0)
        emulated.sync()
    tracker.observe(source.read())
    start = emulated.sim_time_s
    for _ in range(10):  # ten 30 s cycles: the whole window
        for _ in range(30):
            clock.advance(1.0)
            emulated.sync()
        obs = tracker.observe(source.read())
        window.add(obs.end_time_s, obs.windows)
    res = emulated.result()
    firsts = (res.first_token_s > start) & (res.first_token_s <= emulated.sim_time_s)
    ttft_ms = res.ttft_ms[firsts]
    assert window.requests() == np.count_nonzero(firsts) > 1000
    # 100 ms is a bucket bound of vLLM's TTFT histogram: the share is exact.
    (at_bound,) = window.attainment([ttft(100.0)])
    assert at_bound.exact
    assert at_bound.lower == pytest.approx(np.mean(ttft_ms <= 100.0), abs=1e-12)
    # 70 ms lies inside (60, 80]: the bracket holds the true share, and is not empty.
    (inside,) = window.attainment([ttft(70.0)])
    truth = float(np.mean(ttft_ms <= 70.0))
    assert inside.lower <= truth <= inside.upper
    assert inside.lower == pytest.approx(np.mean(ttft_ms <= 60.0), abs=1e-12)
    assert inside.upper == pytest.approx(np.mean(ttft_ms <= 80.0), abs=1e-12)


def test_the_daemon_exports_attainment_over_its_slo_window(fleet) -> None:  # type: ignore[no-untyped-def]
    from dataclasses import replace

    from prometheus_client import CollectorRegistry

    from exporter.config.values import SloConfig
    from exporter.daemon.daemon import Daemon
    from tests.exporter.daemon.test_daemon import FleetSource, config, cycles

    emulated, clock = fleet
    base = config()
    slo = SloConfig(percentiles=(ttft(100.0), ttft(70.0, 0.9)))
    dep = replace(base.deployments[0], slo=slo)
    registry = CollectorRegistry()
    daemon = Daemon(replace(base, deployments=(dep,)), {"llama": FleetSource(emulated)},
                    registry, emulated.sim_clock)  # fmt: skip
    cycles(daemon, emulated, clock, 3)
    key = {"deployment": "llama", "model_name": "llama"}
    get = registry.get_sample_value
    name = "vllm_sizer_observed_slo_attainment_ratio"
    exact = get(name, {**key, "target": "ttft_p95", "bound": "exact"})
    low = get(name, {**key, "target": "ttft_p90", "bound": "lower"})
    high = get(name, {**key, "target": "ttft_p90", "bound": "upper"})
    assert exact is not None and low is not None and high is not None
    assert 0.0 <= low < high <= 1.0
    requests = get("vllm_sizer_observed_slo_window_requests", key)
    assert requests == daemon.runtimes["llama"].cycle.slo_window.requests() > 0


def predicted(window: SloWindow, target: PercentileTarget, share: float, cycles: int) -> None:
    for k in range(cycles):
        window.add(30.0 * (k + 1), {HistogramName.TTFT_S: HIST_1000})
        window.predicted(30.0 * (k + 1), [PredictedPercentile(target, 90.0, share)])


# 1000 observations a cycle: 875 within 100 ms (a bound), 750 within 60 ms.
HIST_1000 = WindowHistogram.from_cumulative(
    [0.04, 0.06, 0.1], [250, 750, 875, 1000], sum=60.0, count=1000
)


def test_a_shortfall_beyond_the_bracket_is_measured_against_the_models_attainment() -> None:
    target = ttft(100.0, 0.85)
    window = SloWindow(300.0)
    predicted(window, target, 0.925, 3)
    assert window.shortfalls([target]) == {target: pytest.approx(0.05)}
    # Within the bracket (70 ms: observed 0.75 to 0.875): no shortfall that the buckets prove.
    inside = ttft(70.0, 0.8)
    window = SloWindow(300.0)
    predicted(window, inside, 0.86, 3)
    assert window.shortfalls([inside]) == {}
    # The model no higher than observed: nothing to correct.
    window = SloWindow(300.0)
    predicted(window, target, 0.87, 3)
    assert window.shortfalls([target]) == {}


def test_no_correction_from_fewer_than_1000_requests() -> None:
    target = ttft(100.0, 0.85)
    window = SloWindow(300.0)
    for k in range(3):
        window.add(30.0 * (k + 1), {HistogramName.TTFT_S: HIST})  # 40 a cycle
        window.predicted(30.0 * (k + 1), [PredictedPercentile(target, 90.0, 0.99)])
    assert window.shortfalls([target]) == {}


def test_a_huge_shortfall_is_bounded() -> None:
    target = ttft(40.0, 0.5)
    window = SloWindow(300.0)
    predicted(window, target, 1.0, 2)  # observed 0.25 exactly at 40 ms
    assert window.shortfalls([target]) == {target: pytest.approx(0.5)}
