"""Realistic traffic for the simulator: bimodal lengths, recorded (prompt, output) pairs drawn
jointly, a two-rate modulated arrival process, and prompts partly served by a prefix cache."""

from __future__ import annotations

import numpy as np
import pytest

from model import ServerConfig, ServiceParams
from model.simulation.modulation import modulated_profile
from model.simulation.simulator import Simulator
from model.simulation.workloads import (
    LengthDist,
    LengthKind,
    LengthPairs,
    RateProfile,
    RequestTrace,
    cached_prefix_tokens,
    draw_trace,
)

LLAMA = ServiceParams(6.68, 2.01e-2, 5.52e-5)


def test_bimodal_lengths_keep_the_mean_with_cv_1_5(rng: np.random.Generator) -> None:
    values = LengthDist(LengthKind.BIMODAL, 1024).sample(200_000, rng)
    assert set(np.unique(values).tolist()) == {256, 4096}
    assert values.mean() == pytest.approx(1024, rel=0.01)
    assert values.std() / values.mean() == pytest.approx(1.5, rel=0.02)


def test_recorded_pairs_are_drawn_jointly(rng: np.random.Generator) -> None:
    pairs = LengthPairs(np.array([10, 2000, 300]), np.array([5000, 7, 40]))
    n_in, n_out = pairs.sample(1000, rng)
    recorded = {(10, 5000), (2000, 7), (300, 40)}
    assert set(zip(n_in.tolist(), n_out.tolist(), strict=True)) == recorded
    trace = draw_trace(RateProfile.constant(5.0, 100.0), LengthDist(LengthKind.FIXED, 1),
                       LengthDist(LengthKind.FIXED, 1), rng, pairs=pairs)  # fmt: skip
    got = set(zip(trace.input_tokens.tolist(), trace.output_tokens.tolist(), strict=True))
    assert got == recorded
    with pytest.raises(ValueError, match="equally long"):
        LengthPairs(np.array([1, 2]), np.array([3]))


def test_cached_prefix_leaves_one_token_to_compute() -> None:
    n = np.array([1, 2, 10, 1001])
    assert cached_prefix_tokens(n, 0.5).tolist() == [0, 1, 5, 500]
    assert cached_prefix_tokens(n, 0.99).tolist() == [0, 1, 9, 990]
    with pytest.raises(ValueError, match="`prefix_hit_share` must be a number in \\[0, 1\\)"):
        cached_prefix_tokens(n, 1.0)
    with pytest.raises(ValueError, match="`cached_tokens`"):
        RequestTrace(np.zeros(1), np.array([4]), np.array([1]), np.array([4]))


def test_modulated_arrivals_keep_the_mean_and_are_bursty(rng: np.random.Generator) -> None:
    rate, ratio = 10.0, 4.0
    profile = modulated_profile(rate, 20_000.0, rng, ratio=ratio, period_s=30.0)
    levels = {s.start_rps for s in profile.segments}
    assert sorted(levels) == pytest.approx([4.0, 16.0])  # 2 r / (1 + R) and 2 r R / (1 + R)
    long = modulated_profile(rate, 400_000.0, rng, ratio=ratio, period_s=30.0)
    assert float(long.cumulative(400_000.0)) / 400_000.0 == pytest.approx(rate, rel=0.03)
    trace = draw_trace(profile, LengthDist(LengthKind.FIXED, 1), LengthDist(LengthKind.FIXED, 1),
                       rng, duration_s=20_000.0)  # fmt: skip
    counts = np.bincount(trace.arrival_s.astype(np.int64) // 10)[:-1]  # 10 s bins
    assert counts.var() / counts.mean() > 5.0  # Poisson would give 1
    plain = RateProfile.constant(rate, 20_000.0)
    steady = draw_trace(plain, LengthDist(LengthKind.FIXED, 1), LengthDist(LengthKind.FIXED, 1),
                        rng, duration_s=20_000.0)  # fmt: skip
    steady_counts = np.bincount(steady.arrival_s.astype(np.int64) // 10)[:-1]
    assert steady_counts.var() / steady_counts.mean() == pytest.approx(1.0, abs=0.15)


def simulate_shared_prefix(share: float) -> tuple[float, int, RequestTrace]:
    """Mean TTFT (ms) of a moderate load of 4096-token prompts, the tokens the replica computed
    (prompt and output), and the requests."""
    rng = np.random.default_rng(11)
    trace = draw_trace(RateProfile.constant(3.0, 300.0), LengthDist(LengthKind.FIXED, 4096),
                       LengthDist(LengthKind.FIXED, 64), rng, prefix_hit_share=share)  # fmt: skip
    sim = Simulator(LLAMA, ServerConfig(256, 8192), record_iterations=True)
    sim.add_requests(trace)
    result = sim.run()
    computed = sum(r.tokens_per_iteration * r.iterations for r in sim.drain_records())
    assert result.completed == len(trace)
    return float(np.mean(result.ttft_ms)), computed, trace


def test_a_cached_prefix_is_not_computed() -> None:
    ttft_0, computed_0, trace_0 = simulate_shared_prefix(0.0)
    ttft_half, computed_half, trace = simulate_shared_prefix(0.5)
    assert np.array_equal(trace.arrival_s, trace_0.arrival_s)
    assert trace.cached_tokens is not None and set(trace.cached_tokens.tolist()) == {2048}
    # Each token computed once: the uncached prompt, then the outputs but the first (it comes
    # with the last prefill chunk).
    for computed, t in ((computed_0, trace_0), (computed_half, trace)):
        assert t.cached_tokens is not None
        expected = (t.input_tokens - t.cached_tokens).sum() + (t.output_tokens - 1).sum()
        assert computed == expected
    assert ttft_half < 0.7 * ttft_0  # half the prefill compute, and less queueing behind it
