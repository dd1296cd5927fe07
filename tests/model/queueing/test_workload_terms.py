"""Workload terms of the refined variant: length spread in the KV context, prefix-cache hits,
arrival bursts and the prompt work ahead of a new prompt. The KV context term and the wait for
prompt work are checked against the simulator."""

from __future__ import annotations

import math

import numpy as np
import pytest

from model.queueing.analyzer import analyze
from model.queueing.chain import workload_table
from model.queueing.params import ServerConfig, ServiceParams, Workload
from model.queueing.prefill_queue import bursty_delay_prob, prefill_work_queue
from model.queueing.sizing import max_rate_for_slo
from model.queueing.variant import DEFAULT_MODEL, PAPER_MODEL, ModelOptions
from model.simulation.simulator import Simulator
from model.simulation.workloads import LengthDist, LengthKind, RateProfile, draw_trace

LLAMA = ServiceParams(6.68, 2.01e-2, 5.52e-5)
SERVER = ServerConfig(max_batch_size=256, max_num_batched_tokens=8192)
SHAPES = (Workload(1024, 512), Workload(128, 2048), Workload(4096, 256))


def saturation(workload: Workload, options: ModelOptions = PAPER_MODEL) -> float:
    return float(analyze(LLAMA, SERVER, workload, 0.0, options=options).saturation_rate_rps)


def ttft(workload: Workload, rates: np.ndarray, **opts: float) -> np.ndarray:
    return np.asarray(
        analyze(LLAMA, SERVER, workload, rates, options=ModelOptions(**opts)).ttft_ms
    )


# --- defaults --------------------------------------------------------------------------------


def test_prefix_hit_ratio_defaults_to_zero_and_round_trips() -> None:
    assert DEFAULT_MODEL.prefix_hit_ratio == 0.0
    legacy = {k: v for k, v in DEFAULT_MODEL.to_dict().items() if k != "prefix_hit_ratio"}
    assert ModelOptions.from_dict(legacy) == DEFAULT_MODEL
    opts = ModelOptions(prefix_hit_ratio=0.4)
    assert ModelOptions.from_dict(opts.to_dict()) == opts


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5, math.nan])
def test_prefix_hit_ratio_outside_unit_interval_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="prefix_hit_ratio"):
        ModelOptions(prefix_hit_ratio=bad)


@pytest.mark.parametrize("workload", SHAPES)
def test_new_terms_at_their_defaults_change_nothing(workload: Workload) -> None:
    """No prefix hits and arrivals no burstier than Poisson: every output bit-identical to the
    table without the new inputs (the golden and pinned cases hold the absolute values)."""
    rates = np.linspace(0.0, 1.2, 13) * saturation(workload)
    for arrival_cv in (0.0, 0.5, 1.0):
        base = analyze(LLAMA, SERVER, workload, rates, options=ModelOptions(arrival_cv=arrival_cv))
        same = analyze(
            LLAMA,
            SERVER,
            workload,
            rates,
            options=ModelOptions(arrival_cv=arrival_cv, prefix_hit_ratio=0.0),
        )
        np.testing.assert_array_equal(base.ttft_ms, same.ttft_ms)
        np.testing.assert_array_equal(base.itl_ms, same.itl_ms)
    # The paper variant ignores the new inputs.
    paper = analyze(LLAMA, SERVER, workload, rates, options=PAPER_MODEL)
    paper_hits = analyze(
        LLAMA,
        SERVER,
        workload,
        rates,
        options=ModelOptions(variant=PAPER_MODEL.variant, prefix_hit_ratio=0.5, arrival_cv=3.0),
    )
    np.testing.assert_array_equal(paper.ttft_ms, paper_hits.ttft_ms)


# --- monotone in spread, hits and burstiness -------------------------------------------------


@pytest.mark.parametrize("workload", SHAPES)
@pytest.mark.parametrize("name", ["arrival_cv", "input_length_cv", "output_length_cv"])
def test_ttft_never_falls_as_a_cv_grows(workload: Workload, name: str) -> None:
    rates = np.linspace(0.05, 0.6, 12) * saturation(workload)
    base = {"arrival_cv": 1.0, "input_length_cv": 0.3, "output_length_cv": 0.3}
    previous = ttft(workload, rates, **base)
    for cv in (1.0, 1.5, 2.0, 3.0, 4.0):
        if cv <= base[name]:
            continue
        now = ttft(workload, rates, **{**base, name: cv})
        assert np.all(now >= previous * (1 - 1e-12)), (name, cv)
        previous = now


def test_bursts_raise_the_wait_and_keep_light_load() -> None:
    workload = SHAPES[0]
    rates = np.array([1e-6, 0.5, 0.7]) * saturation(workload)
    poisson, bursty = ttft(workload, rates), ttft(workload, rates, arrival_cv=2.0)
    # Gamma clumps queue even at a light mean rate (P(wait) ~ rho^(1/ca2)), but little.
    assert poisson[0] < bursty[0] < 1.02 * poisson[0]
    assert np.all(bursty[1:] > 1.1 * poisson[1:])


@pytest.mark.parametrize("rho", [1e-4, 0.05, 0.3, 0.7, 0.95])
@pytest.mark.parametrize("ca2", [1.0, 4.0, 16.0])
def test_bursty_delay_probability_is_the_gi_m_1_root(rho: float, ca2: float) -> None:
    sigma = float(bursty_delay_prob(np.array([rho]), ca2)[0])
    k = 1.0 / ca2
    assert sigma == pytest.approx((1.0 + (1.0 - sigma) / (k * rho)) ** -k, abs=1e-9)
    assert rho - 1e-9 <= sigma < 1.0  # clumps wait at least as often as Poisson arrivals


def test_bursty_prefill_queue_is_continuous_at_poisson_and_exact_for_exponential_work() -> None:
    rate, service = np.array([0.01, 0.02]), np.array([20.0, 30.0])
    poisson = prefill_work_queue(rate, service, np.ones(2), 1.0)
    barely = prefill_work_queue(rate, service, np.ones(2), 1.0 + 1e-9)
    np.testing.assert_allclose(barely.mean_ms, poisson.mean_ms, rtol=1e-6)
    # Exponential prompt work under gamma arrivals: the GI/M/1 mean wait sigma / (1 - sigma) E[S].
    bursty = prefill_work_queue(rate, service, np.ones(2), 4.0)
    sigma = bursty_delay_prob(rate * service, 4.0)
    np.testing.assert_allclose(bursty.mean_ms, sigma / (1.0 - sigma) * service)
    assert np.all(bursty.mean_ms > 2.0 * poisson.mean_ms)


@pytest.mark.parametrize("workload", SHAPES)
def test_prefix_hits_cut_ttft_and_raise_capacity(workload: Workload) -> None:
    rates = np.linspace(0.0, 0.7, 8) * saturation(workload)
    previous, sat = ttft(workload, rates), saturation(workload, DEFAULT_MODEL)
    for hit in (0.25, 0.5, 0.9):
        now = ttft(workload, rates, prefix_hit_ratio=hit)
        assert np.all(now < previous)
        previous = now
        opts = ModelOptions(prefix_hit_ratio=hit)
        assert saturation(workload, opts) >= sat
    # The KV context keeps the cached tokens: decode work is unchanged.
    plain = workload_table(LLAMA, SERVER, workload)
    cached = workload_table(LLAMA, SERVER, workload, options=ModelOptions(prefix_hit_ratio=0.5))
    np.testing.assert_array_equal(plain.w_dec_ms, cached.w_dec_ms)


# --- where spread saturates ------------------------------------------------------------------


def test_output_spread_makes_a_shape_unstable_the_mean_model_calls_stable() -> None:
    """128/2048 with output CV 1 saturates near 0.7 of the mean model's capacity: the refined
    model says unstable there (infinite TTFT, never a finite low latency) and sizes below it."""
    workload = SHAPES[1]
    rate = 0.75 * saturation(workload)
    mean = analyze(LLAMA, SERVER, workload, rate, options=DEFAULT_MODEL)
    spread = ModelOptions(output_length_cv=1.0)
    at = analyze(LLAMA, SERVER, workload, rate, options=spread)
    assert mean.stable and math.isfinite(mean.ttft_ms)
    assert not at.stable and math.isinf(at.ttft_ms)
    assert 0.6 < saturation(workload, spread) / saturation(workload) < 0.72
    cap = max_rate_for_slo(LLAMA, SERVER, workload, ttft_ms=10 * mean.ttft_ms, options=spread)
    assert cap.rate_rps < saturation(workload, spread)


def test_kv_context_term_matches_the_simulators_capacity() -> None:
    """Overload one simulated replica with 128/2048 requests whose outputs are lognormal with
    CV 1: its completion rate is the refined model's saturation rate with the drawn requests'
    output CV (n + E[m^2] / (2 E[m]) in the KV context), well below the mean model's."""
    rng = np.random.default_rng(1717)
    paper_sat = saturation(SHAPES[1])
    profile = RateProfile.constant(2.0 * paper_sat, 2400.0)
    trace = draw_trace(
        profile,
        LengthDist(LengthKind.UNIFORM, 128),
        LengthDist(LengthKind.LOGNORMAL, 2048, 1.0),
        rng,
    )
    sim = Simulator(LLAMA, SERVER)
    sim.add_requests(trace)
    res = sim.run(until_s=2400.0)
    # Steady state: completions in the second half, once the batch holds the length-biased mix.
    done = res.finished_between(1200.0, 2400.0)
    sim_rate = float(done.sum()) / 1200.0
    out = np.asarray(trace.output_tokens, dtype=np.float64)
    seen = Workload(float(np.mean(trace.input_tokens)), float(out.mean()))
    spread = ModelOptions(output_length_cv=float(out.std() / out.mean()))
    assert sim_rate == pytest.approx(saturation(seen, spread), rel=0.1)
    assert sim_rate < 0.8 * saturation(seen, DEFAULT_MODEL)


# --- prompt work ahead on a prefill-heavy shape -------------------------------------------


@pytest.mark.parametrize(
    ("lengths", "cv"), [(LengthKind.UNIFORM, 0.0), (LengthKind.LOGNORMAL, 1.0)]
)
def test_wait_and_prefill_of_long_prompts_follow_the_simulator(
    lengths: LengthKind, cv: float
) -> None:
    """4096/256 at 0.7 of saturation, Poisson: the refined TTFT without its first-token term (one
    decode iteration, alpha + (X-bar + 1) d) is the simulator's TTFT (first token with the last
    chunk): the wait for the step in progress, for the prompts ahead (the prefill-work queue)
    and its own prefill step with the prompts that join it. Without the prefill-work queue and
    the joining prompts the model was 10 % (uniform) and 16 % (lognormal CV 1) short."""
    workload = SHAPES[2]
    rate = 0.7 * saturation(workload)
    rng = np.random.default_rng(4096)
    dists = (LengthDist(lengths, 4096, cv), LengthDist(lengths, 256, cv))
    trace = draw_trace(RateProfile.constant(rate, 2400.0), *dists, rng)
    sim = Simulator(LLAMA, SERVER)
    sim.add_requests(trace)
    res = sim.run(until_s=2700.0)
    keep = res.arrived_between(300.0, 2400.0)
    n_in, n_out = res.input_tokens[keep], res.output_tokens[keep]
    seen = Workload(float(n_in.mean()), float(n_out.mean()))
    options = ModelOptions(input_length_cv=float(n_in.std() / n_in.mean()),
                           output_length_cv=float(n_out.std() / n_out.mean()))
    model = analyze(LLAMA, SERVER, seen, rate, options=options)
    w_dec = float(workload_table(LLAMA, SERVER, seen, options=options).w_dec_ms.flat[0])
    d = w_dec / seen.avg_output_tokens
    first = LLAMA.alpha_ms + (model.avg_batch_size + 1.0) * d
    assert model.ttft_ms - first == pytest.approx(float(np.mean(res.ttft_ms[keep])), rel=0.06)
