"""Observations carry their window's measured workload CVs; the fit evaluates each point with its
own (on a 10 % grid, so nearly equal CVs share one model call)."""

from __future__ import annotations

import numpy as np
import pytest

from model import Observation, ServerConfig, ServiceParams, Workload, fit
from model.calibration.residuals import FIT_CV_GRID, FitProblem
from model.queueing.analyzer import analyze_points, max_rate
from model.queueing.variant import PAPER_MODEL, ModelOptions

LLAMA = ServiceParams(6.68, 2.01e-2, 5.52e-5)
SERVER = ServerConfig(256, 8192)


def point(n: float, m: float, load: float, cv_in: float, cv_out: float) -> Observation:
    """A noiseless observation of the refined model with the given length CVs."""
    rate = load * max_rate(LLAMA, SERVER, Workload(n, m))
    opts = ModelOptions(input_length_cv=cv_in, output_length_cv=cv_out)
    a = analyze_points(LLAMA, SERVER, [n], [m], [rate], options=opts)
    return Observation(
        rate_rps=rate, avg_input_tokens=n, avg_output_tokens=m,
        ttft_ms=float(a.ttft_ms[0]), itl_ms=float(a.itl_ms[0]),
        input_length_cv=cv_in, output_length_cv=cv_out,
    )  # fmt: skip


def test_cvs_round_trip_and_are_validated() -> None:
    obs = point(1024, 256, 0.5, 1.0, 2.0)
    assert Observation.from_dict(obs.to_dict()) == obs
    assert Observation.from_dict({**obs.to_dict(), "arrival_cv": None}).arrival_cv is None
    with pytest.raises(ValueError, match=r"`output_length_cv` must be .*got -1"):
        Observation(**{**obs.to_dict(), "output_length_cv": -1.0})


def test_model_options_take_the_measured_cvs_and_round_them_on_a_grid() -> None:
    obs = point(1024, 256, 0.5, 1.03, 0.0)
    base = ModelOptions(arrival_cv=1.0, input_length_cv=0.5)
    assert obs.model_options(base) == ModelOptions(input_length_cv=1.03, output_length_cv=0.0)
    on_grid = obs.model_options(base, grid=FIT_CV_GRID)
    assert on_grid.input_length_cv == 1.0 and on_grid.output_length_cv == 0.0
    assert obs.model_options(PAPER_MODEL) is PAPER_MODEL  # the paper variant has no CVs


def test_the_fit_evaluates_each_point_with_its_own_cvs() -> None:
    shapes = [(1024, 256), (512, 512), (2048, 128), (256, 1024), (1024, 1024)]
    obs = [
        point(n, m, load, cv, cv)
        for (n, m), load, cv in zip(shapes * 2, np.linspace(0.2, 0.8, 10), [0.0, 1.0] * 5,
                                    strict=True)
    ]  # fmt: skip
    problem = FitProblem(obs, SERVER)
    assert len(problem.groups) == 2  # CV 0 and CV 1: one model call each
    errors, _ = problem.relative_errors(LLAMA)
    assert np.abs(errors).max() < 1e-9  # each point predicted with the CVs that made it
    # The same points without their CVs are mispredicted where the CV was 1 ...
    stripped = [Observation(**{**o.to_dict(), "input_length_cv": None,
                               "output_length_cv": None}) for o in obs]  # fmt: skip
    errors, _ = FitProblem(stripped, SERVER).relative_errors(LLAMA)
    assert np.abs(errors[1::2]).max() > 0.02
    # ... and a fit from an offset start recovers the parameters only with them.
    result = fit(obs, SERVER, ServiceParams(5.0, 0.03, 8e-5))
    assert result.success
    for got, want in zip(result.params.as_tuple(), LLAMA.as_tuple(), strict=True):
        assert got == pytest.approx(want, rel=0.02)


def test_hit_ratio_is_carried_validated_and_rounded_on_the_grid() -> None:
    obs = Observation(**{**point(1024, 256, 0.5, 0.0, 0.0).to_dict(), "prefix_hit_ratio": 0.507})
    assert Observation.from_dict(obs.to_dict()) == obs
    assert obs.model_options(ModelOptions()).prefix_hit_ratio == 0.507
    assert obs.model_options(ModelOptions(), grid=FIT_CV_GRID).prefix_hit_ratio == pytest.approx(
        0.5
    )
    assert obs.model_options(PAPER_MODEL) is PAPER_MODEL
    # A window read as all hits is evaluated just below (the model takes a ratio below 1).
    assert Observation(**{**obs.to_dict(), "prefix_hit_ratio": 1.0}).prefix_hit_ratio == 0.99
    with pytest.raises(ValueError, match=r"`prefix_hit_ratio` must be in \[0, 1\], got 1.5"):
        Observation(**{**obs.to_dict(), "prefix_hit_ratio": 1.5})


def test_points_with_half_their_prompt_tokens_cached_fit_the_true_prefill_cost() -> None:
    """Half the prefill is skipped: a fit that ignores it takes the engine for a faster one
    (beta about halved), which over-states the capacity of uncached traffic."""
    hits = ModelOptions(prefix_hit_ratio=0.5)
    shapes = [(1024, 256), (512, 512), (2048, 128), (256, 1024), (1024, 1024)]
    obs = []
    for (n, m), load in zip(shapes * 2, np.linspace(0.2, 0.8, 10), strict=True):
        rate = load * max_rate(LLAMA, SERVER, Workload(n, m), options=hits)
        a = analyze_points(LLAMA, SERVER, [n], [m], [rate], options=hits)
        obs.append(Observation(rate_rps=rate, avg_input_tokens=n, avg_output_tokens=m,
                               ttft_ms=float(a.ttft_ms[0]), itl_ms=float(a.itl_ms[0]),
                               prefix_hit_ratio=0.5))  # fmt: skip
    start = ServiceParams(5.0, 0.03, 8e-5)
    result = fit(obs, SERVER, start)
    assert result.success
    for got, want in zip(result.params.as_tuple(), LLAMA.as_tuple(), strict=True):
        assert got == pytest.approx(want, rel=0.02)
    blind = [Observation(**{**o.to_dict(), "prefix_hit_ratio": None}) for o in obs]
    assert fit(blind, SERVER, start).params.beta_ms < 0.8 * LLAMA.beta_ms
