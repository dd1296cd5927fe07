"""The steepest split one operating point allows (model/calibration/split.py)."""

from __future__ import annotations

import pytest

from model import ServerConfig, ServiceParams, Workload, analyze, max_rate_for_slo
from model.calibration.split import steepest_split

SERVER, SHAPE = ServerConfig(), Workload(1024, 512)
TRUTH = ServiceParams(6.68, 2.01e-2, 5.52e-5)
ALPHA_HEAVY = ServiceParams(9.717, 9.437e-3, 1.497e-5)  # a partial fit at 6.5 req/s


@pytest.mark.parametrize("rate_rps", [1.0, 4.0, 6.5])
def test_the_split_predicts_the_same_point_and_a_lower_capacity(rate_rps: float) -> None:
    steep = steepest_split(ALPHA_HEAVY, SERVER, SHAPE, rate_rps, 0.5)
    assert steep is not None and steep.alpha_ms == 0.5
    fit, other = (analyze(p, SERVER, SHAPE, rate_rps) for p in (ALPHA_HEAVY, steep))
    assert float(other.ttft_ms) == pytest.approx(float(fit.ttft_ms), rel=0.01)
    assert float(other.itl_ms) == pytest.approx(float(fit.itl_ms), rel=0.01)
    capacity = max_rate_for_slo(steep, SERVER, SHAPE, ttft_ms=50, itl_ms=25).rate_rps
    assert capacity < max_rate_for_slo(ALPHA_HEAVY, SERVER, SHAPE, ttft_ms=50, itl_ms=25).rate_rps
    # Nearly all of the latency grows with load: it saturates just past the point.
    assert float(analyze(steep, SERVER, SHAPE, rate_rps).saturation_rate_rps) < 1.5 * rate_rps


def test_the_truth_lies_on_the_family_between_the_split_and_the_fit() -> None:
    # The fit and the truth agree on neither parameter, but alpha at the truth's 6.68 along
    # the fit's open direction gives a capacity between the steepest split's and the fit's.
    caps = [
        max_rate_for_slo(p, SERVER, SHAPE, ttft_ms=50, itl_ms=25).rate_rps
        for p in (
            steepest_split(ALPHA_HEAVY, SERVER, SHAPE, 6.5, 0.01),
            steepest_split(ALPHA_HEAVY, SERVER, SHAPE, 6.5, TRUTH.alpha_ms),
            ALPHA_HEAVY,
        )
        if p is not None
    ]
    assert len(caps) == 3 and caps[0] < caps[1] < caps[2]


def test_no_split_at_a_saturating_load_and_none_needed_below_the_floor() -> None:
    assert steepest_split(ALPHA_HEAVY, SERVER, SHAPE, 40.0, 0.5) is None
    assert steepest_split(ALPHA_HEAVY, SERVER, SHAPE, 6.5, 20.0) == ALPHA_HEAVY
