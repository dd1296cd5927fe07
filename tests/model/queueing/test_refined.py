"""Refined (B5) variant: limits, closed forms, monotonicity, plumbing. Refinements §6."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import poisson

from model.queueing.analyzer import analyze, analyze_points, max_rate
from model.queueing.params import ServerConfig, ServiceParams, Workload
from model.queueing.refined import busy_at_constant_rate, seen_at_constant_rate
from model.queueing.sizing import max_rate_for_slo, replicas_for_slo
from model.queueing.variant import (
    LLAMA_3_1_8B,
    PAPER_MODEL,
    QWEN_2_5_14B,
    UNIFORM_HALF_WIDTH_CV,
    ArchitectureSpec,
    ModelOptions,
    ModelVariant,
)
from tests.conftest import load_paper_grid

LLAMA = ServiceParams(6.68, 2.01e-2, 5.52e-5)
SERVER = ServerConfig(max_batch_size=256, max_num_batched_tokens=8192)
SHAPE = Workload(1024, 512)
CV = UNIFORM_HALF_WIDTH_CV


def refined(arrival_cv: float, *, cv: float = CV, arch: ArchitectureSpec | None = LLAMA_3_1_8B):
    return ModelOptions(
        variant=ModelVariant.REFINED,
        arrival_cv=arrival_cv,
        input_length_cv=cv,
        output_length_cv=cv,
        architecture=arch,
    )


def work_terms(p: ServiceParams, n: float, m: float, cv: float, kappa: float):
    """Hand-written W_pref (c = 1) and d = W_dec / m of refinements §6."""
    a, b, g = p.as_tuple()
    w_pref = b * n + g * n + b * kappa * n * n * (1 + cv * cv) / 2
    w_dec = b * m + g * (m * n + (m * m * (1 + cv * cv) + m) / 2)
    return a, w_pref, w_dec / m


# --- options -------------------------------------------------------------------------------


def test_default_is_refined_and_paper_ignores_refined_inputs():
    assert ModelOptions().variant is ModelVariant.REFINED
    assert PAPER_MODEL.variant is ModelVariant.PAPER
    rates = np.array([0.5, 5.0, 11.0])
    plain = analyze(LLAMA, SERVER, SHAPE, rates, options=PAPER_MODEL)
    dressed = ModelOptions(
        variant=ModelVariant.PAPER, arrival_cv=0.0, input_length_cv=0.3, architecture=LLAMA_3_1_8B
    )
    same = analyze(LLAMA, SERVER, SHAPE, rates, options=dressed)
    for name in ("ttft_ms", "itl_ms", "avg_service_ms", "max_rate_rps"):
        np.testing.assert_array_equal(getattr(same, name), getattr(plain, name))


def test_attention_ratio_of_the_grid_models():
    assert LLAMA_3_1_8B.attention_ratio == pytest.approx(3.26e-5, rel=2e-3)
    assert QWEN_2_5_14B.attention_ratio == pytest.approx(3.33e-5, rel=2e-3)
    assert ModelOptions().attention_ratio == 0.0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"arrival_cv": -0.1}, "arrival_cv"),
        ({"input_length_cv": math.nan}, "input_length_cv"),
        ({"output_length_cv": -1}, "output_length_cv"),
        ({"variant": "exact"}, "variant"),
        ({"architecture": "llama"}, "architecture"),
    ],
)
def test_options_reject_bad_values(kwargs, field):
    with pytest.raises(ValueError, match=f"`{field}`"):
        ModelOptions(**kwargs)


def test_architecture_rejects_bad_values():
    with pytest.raises(ValueError, match="`num_layers`"):
        ArchitectureSpec(0, 4096, 8e9)
    with pytest.raises(ValueError, match="`num_parameters`"):
        ArchitectureSpec(32, 4096, 0.0)


def test_options_round_trip_and_string_variant():
    opts = ModelOptions(variant="refined", arrival_cv=0.0, architecture=QWEN_2_5_14B)
    assert opts.variant is ModelVariant.REFINED
    assert ModelOptions.from_dict(opts.to_dict()) == opts
    assert ModelOptions.from_dict(PAPER_MODEL.to_dict()) == PAPER_MODEL


def test_synchronous_mask_is_checked():
    with pytest.raises(ValueError, match="`synchronous`"):
        analyze_points(LLAMA, SERVER, [1024, 64], [512, 64], [1.0, 1.0], synchronous=[True])
    with pytest.raises(ValueError, match="`synchronous`"):
        analyze_points(LLAMA, SERVER, [1024], [512], [1.0], synchronous=[1])


# --- limits and closed forms ---------------------------------------------------------------


@pytest.mark.parametrize("arrival_cv", [0.0, 1.0])
def test_light_load_is_one_idle_prefill_plus_one_decode_iteration(arrival_cv):
    a, w_pref, d = work_terms(LLAMA, 1024, 512, CV, LLAMA_3_1_8B.attention_ratio)
    res = analyze(LLAMA, SERVER, SHAPE, 1e-7, options=refined(arrival_cv))
    # Occupancy (hence the others' decode work) vanishes in proportion to the rate.
    assert res.avg_prefill_ms == pytest.approx(a + w_pref, rel=1e-7)
    assert res.ttft_ms == pytest.approx(a + w_pref + a + d, rel=1e-7)
    assert res.itl_ms == pytest.approx(a + d, rel=1e-7)


def test_synchronous_runs_have_the_closed_form_at_any_rate():
    a, w_pref, d = work_terms(LLAMA, 1024, 512, CV, LLAMA_3_1_8B.attention_ratio)
    res = analyze_points(
        LLAMA,
        SERVER,
        [1024, 1024],
        [512, 512],
        [0.2, 8.0],
        options=refined(0.0),
        synchronous=np.array([True, True]),
    )
    np.testing.assert_allclose(res.ttft_ms, 2 * a + w_pref + d, rtol=1e-12)
    np.testing.assert_allclose(res.itl_ms, a + d, rtol=1e-12)
    np.testing.assert_allclose(res.avg_prefill_ms, a + w_pref, rtol=1e-12)


def test_without_attention_or_dispersion_the_chain_is_the_papers():
    rates = np.array([0.5, 5.0, 12.0])
    paper = analyze(LLAMA, SERVER, SHAPE, rates)
    ref = analyze(LLAMA, SERVER, SHAPE, rates, options=refined(1.0, cv=0.0, arch=None))
    for name in ("avg_batch_size", "avg_service_ms", "avg_wait_ms", "max_rate_rps"):
        np.testing.assert_allclose(getattr(ref, name), getattr(paper, name), rtol=1e-12)
    # Total service is conserved: T_p + m ITL = S-bar, as in the paper.
    np.testing.assert_allclose(ref.avg_prefill_ms + 512 * ref.itl_ms, ref.avg_service_ms)


def test_attention_lowers_the_saturation_rate():
    plain = max_rate(LLAMA, SERVER, SHAPE)
    assert max_rate(LLAMA, SERVER, SHAPE, options=refined(1.0)) < plain
    assert max_rate(LLAMA, SERVER, SHAPE, options=refined(1.0, cv=0.0, arch=None)) == plain


def test_poisson_fixed_lengths_closed_form():
    # ca2 = 1, no dispersion: Allen-Cunneen factor 1. The wait for prefill work ahead is the
    # larger of the residual's prefill part plus the prompts ahead, b (R_P - L_d/2 + lam R_P w),
    # and the M/D/1 prefill-work queue; later arrivals join its step within the budget.
    a, w, d = work_terms(LLAMA, 1024, 512, 0.0, 0.0)
    rate = 6.0
    res = analyze(LLAMA, SERVER, SHAPE, rate, options=refined(1.0, cv=0.0, arch=None))
    lam = rate / 1000
    x_o, busy = res.avg_batch_size, res.busy_prob
    assert res.chunks == 1
    l_d = a + x_o * d
    mu = lam * l_d / (1 - lam * w)
    r_p = (l_d**2 + 2 * l_d * w * mu + w * w * (mu + mu * mu)) / (2 * (l_d + w * mu))
    ahead = busy * (max(r_p - l_d / 2, 0.0) + lam * r_p * w)
    work = w + l_d * 1024 / (8192 - x_o)  # a prompt's time on the prefill server
    rho = lam * work
    queued = rho / (1 - rho) * work / 2  # Pollaczek-Khinchine, deterministic service
    k = np.arange(40)
    count = lam * r_p  # later arrivals; the budget holds (8192 - x_o) / 1024 - 1 - count of them
    fit = (8192 - x_o) / 1024 - 1 - count
    joined = busy * w * np.sum(np.minimum(k, fit) * poisson.pmf(k, count))
    expected = res.avg_wait_ms + busy * l_d / 2 + max(ahead, queued) + joined
    expected += (l_d + w) + (l_d + d)
    assert res.ttft_ms == pytest.approx(expected, rel=1e-12)
    assert res.avg_prefill_ms == pytest.approx(l_d + w, rel=1e-12)


def test_constant_rate_fixed_lengths_closed_form():
    # ca2 = 0, no dispersion: half an iteration if busy, no collisions.
    a, w, d = work_terms(LLAMA, 1024, 512, 0.0, 0.0)
    rate = 6.0
    res = analyze(LLAMA, SERVER, SHAPE, rate, options=refined(0.0, cv=0.0, arch=None))
    s_bar, lam = res.avg_service_ms, rate / 1000
    # Brute-force sum over the earlier arrivals, S_r ~ U[S/2, 3S/2].
    t = np.arange(1, 100_000) / lam
    seen = np.clip((1.5 * s_bar - t) / s_bar, 0.0, 1.0).sum()
    busy = min(1.0, max(0.0, (1.5 * s_bar - 1 / lam) / s_bar))
    l_d = a + seen * d
    expected = res.avg_wait_ms + busy * l_d / 2 + (l_d + w) + (l_d + d)
    assert res.ttft_ms == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("service_ms", [0.3, 1.0, 7.5, 40.0, 1234.5])
def test_seen_at_constant_rate_matches_the_sum(service_ms):
    lam = np.array([0.0, 0.05, 0.5, 1.0, 2.0 / 3.0, 3.0])
    got = seen_at_constant_rate(np.full(6, service_ms), lam)
    for k, rate in enumerate(lam):
        t = np.arange(1, 20_000) / rate if rate > 0 else np.array([np.inf])
        want = np.clip((1.5 * service_ms - t) / service_ms, 0.0, 1.0).sum()
        assert got[k] == pytest.approx(want, rel=1e-12, abs=1e-12)
    busy = busy_at_constant_rate(np.full(6, service_ms), lam)
    assert busy[0] == 0.0
    assert np.all((busy >= 0) & (busy <= 1))


def test_seen_at_constant_rate_approaches_little_minus_half():
    lam, s = 1.0, np.array([1e4])
    assert seen_at_constant_rate(s, np.array([lam]))[0] == pytest.approx(lam * s[0] - 0.5, abs=1e-6)


# --- shape ---------------------------------------------------------------------------------


@pytest.mark.parametrize("arrival_cv", [0.0, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("shape", [Workload(1024, 512), Workload(4096, 64), Workload(64, 1024)])
def test_ttft_is_increasing_in_rate(arrival_cv, shape):
    top = max_rate(LLAMA, SERVER, shape, options=refined(arrival_cv))
    rates = np.linspace(top * 1e-3, top * 0.95, 300)
    res = analyze(LLAMA, SERVER, shape, rates, options=refined(arrival_cv))
    assert np.all(np.diff(res.ttft_ms) >= -1e-9 * res.ttft_ms[1:])
    assert np.all(np.isfinite(res.ttft_ms))


def test_poisson_arrivals_wait_longer_than_constant_rate():
    rates = np.linspace(1.0, 11.0, 11)
    poisson = analyze(LLAMA, SERVER, SHAPE, rates, options=refined(1.0))
    const = analyze(LLAMA, SERVER, SHAPE, rates, options=refined(0.0))
    assert np.all(poisson.ttft_ms > const.ttft_ms)


def test_unstable_rates_are_infinite():
    top = max_rate(LLAMA, SERVER, SHAPE, options=refined(1.0))
    res = analyze(LLAMA, SERVER, SHAPE, [top, 2 * top], options=refined(1.0))
    assert list(res.stable) == [True, False]
    assert math.isinf(res.ttft_ms[1]) and math.isinf(res.itl_ms[1])


def test_scalar_array_and_points_agree():
    opts = refined(0.3)
    rates = np.array([0.7, 4.0, 9.5])
    arr = analyze(LLAMA, SERVER, SHAPE, rates, options=opts)
    pts = analyze_points(LLAMA, SERVER, [1024] * 3, [512] * 3, rates, options=opts)
    for k, rate in enumerate(rates):
        one = analyze(LLAMA, SERVER, SHAPE, float(rate), options=opts)
        assert isinstance(one.ttft_ms, float)
        for name in ("ttft_ms", "itl_ms", "avg_prefill_ms", "chunks"):
            assert getattr(one, name) == pytest.approx(getattr(arr, name)[k], rel=1e-12)
            assert getattr(one, name) == pytest.approx(getattr(pts, name)[k], rel=1e-12)


def test_chunked_prefill_counts_come_from_the_table():
    # M = 2048 < n: every prefill needs several chunks; the model stays finite and ordered.
    server = ServerConfig(max_batch_size=64, max_num_batched_tokens=2048)
    shape = Workload(4096, 128)
    res = analyze(LLAMA, server, shape, [0.05, 1.0], options=refined(1.0))
    assert np.all(res.chunks >= 2)
    assert res.ttft_ms[0] < res.ttft_ms[1]


# --- sizing plumbing -----------------------------------------------------------------------


def test_sizing_passes_the_option_through():
    paper = max_rate_for_slo(LLAMA, SERVER, SHAPE, ttft_ms=50.0, itl_ms=25.0)
    ref = max_rate_for_slo(LLAMA, SERVER, SHAPE, ttft_ms=50.0, itl_ms=25.0, options=refined(1.0))
    assert paper.feasible and ref.feasible
    assert ref.rate_rps != pytest.approx(paper.rate_rps, rel=1e-3)
    check = analyze(LLAMA, SERVER, SHAPE, ref.rate_rps, options=refined(1.0))
    assert check.ttft_ms <= 50.0 * (1 + 1e-6) and check.itl_ms <= 25.0 * (1 + 1e-6)
    plan = replicas_for_slo(20.0, LLAMA, SERVER, SHAPE, ttft_ms=50.0, options=refined(1.0))
    assert plan.replicas == math.ceil(20.0 / plan.capacity.rate_rps)
    assert plan.capacity.rate_rps == pytest.approx(
        max_rate_for_slo(LLAMA, SERVER, SHAPE, ttft_ms=50.0, options=refined(1.0)).rate_rps
    )


# --- the reported numbers (refinements §0) -------------------------------------------------


# At the reported B5 parameters; TTFT errors 7.7 / 11.2 % since the mean also takes the
# prefill-work queue and the prompts joining a step (B5 as reported: 7.9 / 11.4 %).
@pytest.mark.parametrize(
    ("model", "arch", "theta", "itl_err", "ttft_err"),
    [
        ("Llama-3.1-8B", LLAMA_3_1_8B, (6.576, 2.004e-2, 5.098e-5), 0.037, 0.0766),
        ("Qwen2.5-14B", QWEN_2_5_14B, (10.198, 3.570e-2, 7.800e-5), 0.073, 0.1116),
    ],
)
def test_grid_errors_at_the_reported_b5_parameters(model, arch, theta, itl_err, ttft_err):
    rows = [r for r in load_paper_grid() if r["model"] == model and r["in_paper_fit"] == "1"]

    def col(key: str) -> np.ndarray:
        return np.array([float(r[key]) for r in rows])

    sync = np.array([r["rate_index"] == "1" for r in rows])
    res = analyze_points(
        ServiceParams(*theta),
        SERVER,
        col("avg_in_tokens"),
        col("avg_out_tokens"),
        col("rate_rps"),
        options=refined(0.0, arch=arch),
        synchronous=sync,
    )
    ttft, itl = col("ttft_ms"), col("itl_ms")
    assert np.mean(np.abs(res.itl_ms - itl)) / itl.mean() == pytest.approx(itl_err, abs=5e-4)
    assert np.mean(np.abs(res.ttft_ms - ttft)) / ttft.mean() == pytest.approx(ttft_err, abs=5e-4)


def test_fit_problem_passes_synchronous_observations_through():
    from model.calibration.observation import Observation
    from model.calibration.residuals import FitProblem

    a, w_pref, d = work_terms(LLAMA, 1024, 512, CV, LLAMA_3_1_8B.attention_ratio)
    closed = Observation(
        rate_rps=0.3,
        avg_input_tokens=1024,
        avg_output_tokens=512,
        ttft_ms=2 * a + w_pref + d,
        itl_ms=a + d,
        synchronous=True,
    )
    problem = FitProblem([closed], SERVER, refined(0.0))
    errors, _ = problem.relative_errors(LLAMA)
    np.testing.assert_allclose(errors, 0.0, atol=1e-12)
    open_run = FitProblem(
        [closed.__class__(**{**closed.to_dict(), "synchronous": False})], SERVER, refined(0.0)
    )
    assert np.abs(open_run.relative_errors(LLAMA)[0]).max() > 1e-3
