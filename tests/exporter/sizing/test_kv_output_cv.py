"""The output-length CV the traffic tracker reads with the KV cache running requests hold, on
emulator runs of known laws at an output-heavy shape (128/2048), against the histograms alone."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from exporter.collector.observations import DeploymentObservation
from exporter.collector.vllm_metrics import HistogramName
from exporter.sizing.traffic import TrafficTracker
from model import Workload
from model.calibration.kv_context import KvContext
from model.simulation.workloads import LengthKind
from tests.exporter.sizing.test_traffic import Run, emulate

OUTPUT_HEAVY = Workload(128, 2048)
# The long requests of the bimodal law (8192 outputs) run about 3 minutes: the first windows
# after a 10-minute warm-up are steady, and the tracker's 10 windows are full from the 10th.
WARM_UP_S = 600
WINDOWS = 20
FULL = 9  # index of the first shape smoothed over 10 windows


def run(kind: LengthKind, cv: float, seed: int) -> Run:
    # Load 0.3: no preemption in the emulator's default cache (449 200 tokens).
    return emulate(
        kind, cv, shape=OUTPUT_HEAVY, load=0.3, replicas=1, seed=seed, warm_up_s=WARM_UP_S,
        windows_read=WINDOWS,
    )  # fmt: skip


def histogram_only(r: Run) -> list[float]:
    """The output CVs the tracker gives from the same windows without the KV reading."""
    tracker = TrafficTracker()
    shapes = [tracker.update(replace(obs, kv_context=None)) for obs in r.observations]
    return [s.output_length_cv for s in shapes[FULL:] if s.output_length_cv is not None]


def with_kv(r: Run) -> list[float]:
    return [s.output_length_cv for s in r.shapes[FULL:] if s.output_length_cv is not None]


@pytest.fixture(scope="module", params=[4, 5])
def bimodal(request: pytest.FixtureRequest) -> Run:
    return run(LengthKind.BIMODAL, 0.0, request.param)


@pytest.fixture(scope="module")
def uniform() -> Run:
    return run(LengthKind.UNIFORM, 0.0, 4)


@pytest.fixture(scope="module")
def lognormal() -> Run:
    return run(LengthKind.LOGNORMAL, 1.0, 4)


def test_a_bimodal_output_law_reads_within_10_percent_with_the_kv_reading(bimodal: Run) -> None:
    # 80 % at 512, 20 % at 8192: CV 1.5.
    read = with_kv(bimodal)
    assert len(read) == WINDOWS - FULL
    assert all(1.35 <= cv <= 1.65 for cv in read), read
    assert np.median(read) == pytest.approx(1.5, rel=0.05)
    assert all(obs.kv_context is not None for obs in bimodal.observations)
    # The histograms alone cannot place the two masses in their buckets: 10 % low or more.
    alone = histogram_only(bimodal)
    assert np.median(alone) < 0.95 * 1.5, alone


@pytest.mark.parametrize(("name", "true_cv", "bounds"), [
    ("uniform", 0.29, (0.0, 0.5)), ("lognormal", 1.0, (0.75, 1.25)),
])  # fmt: skip
def test_uniform_and_lognormal_read_no_worse(
    name: str, true_cv: float, bounds: tuple[float, float], request: pytest.FixtureRequest
) -> None:
    r: Run = request.getfixturevalue(name)
    read, alone = with_kv(r), histogram_only(r)
    assert len(read) == len(alone) == WINDOWS - FULL
    for cv, hist_cv in zip(read, alone, strict=True):
        assert bounds[0] <= cv <= bounds[1], (cv, hist_cv)
        # The KV reading only raises the histogram's, and only towards the law (a few %).
        assert hist_cv <= cv and abs(cv - true_cv) <= abs(hist_cv - true_cv) + 0.05
    assert all(s.kv_output_length_cv is not None for s in r.shapes[FULL:])


def test_the_tracker_sums_the_kv_reads_of_its_last_windows(uniform: Run) -> None:
    obs = uniform.observations[-1]
    prompts = obs.windows[HistogramName.PROMPT_LEN]
    outputs = obs.windows[HistogramName.GENERATION_LEN]
    n, m = prompts.sum / prompts.count, outputs.sum / outputs.count

    def holding(cv: float, running: float) -> DeploymentObservation:
        context = n + m * (1 + cv * cv) / 2  # the mean context of a law with this output CV
        return replace(obs, kv_context=KvContext(context * running, running))

    tracker = TrafficTracker(windows=2)
    assert tracker.update(holding(2.0, 100)).kv_output_length_cv == pytest.approx(2.0)
    # Two windows: their KV tokens and running requests summed, 1:3.
    both = tracker.update(holding(1.0, 300)).kv_output_length_cv
    assert both == pytest.approx(np.sqrt((100 * 5 + 300 * 2) / 400 - 1))
    # A window without a KV read keeps the others; a third one pushes out the first.
    assert tracker.update(replace(obs, kv_context=None)).kv_output_length_cv == both
    assert tracker.update(holding(1.0, 300)).kv_output_length_cv == pytest.approx(1.0)
    # The model's output CV is the larger reading: this narrow law's histogram reads < 0.5.
    assert tracker.shape.output_length_cv == pytest.approx(1.0)
    assert tracker.update(holding(0.0, 300)).output_length_cv == pytest.approx(np.sqrt(0.5))
    low = tracker.update(holding(0.0, 300))
    assert low.kv_output_length_cv == 0.0 and low.output_length_cv is not None
    assert 0.0 < low.output_length_cv < 0.5  # the histogram's
