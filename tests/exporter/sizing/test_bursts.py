"""Bursts measured (issue 38): the sidecar's sampler counts prompt tokens per second, and the
prompt tokens per 5 s of a stream burstier than Poisson read above 1, a Poisson stream's at 1."""

from __future__ import annotations

import numpy as np
import pytest

from exporter.collector.arrival_sampler import CounterSample, prompt_tokens_per_period
from exporter.sizing.bursts import (
    MAX_BURST_FACTOR,
    MIN_BINS,
    BurstTracker,
    poisson_quantile_tokens,
)

# -- the sampler's prompt tokens ---------------------------------------------------------------


def test_the_sampler_reads_prompt_tokens_per_second_and_nothing_across_a_gap_or_reset() -> None:
    tokens = [0.0, 1000.0, 1000.0, 61000.0, 62000.0]
    samples = [CounterSample(float(t), t * 2.0, 100.0, tok) for t, tok in enumerate(tokens)]
    per_s = prompt_tokens_per_period(samples, 0.0, 4.0, 1.0)
    assert per_s is not None and per_s.tolist() == [1000.0, 0.0, 60000.0, 1000.0]
    gap = samples[:2] + samples[3:]
    assert prompt_tokens_per_period(gap, 0.0, 4.0, 1.0) is None
    fell = [*samples[:4], CounterSample(4.0, 8.0, 100.0, 10.0)]
    assert prompt_tokens_per_period(fell, 0.0, 4.0, 1.0) is None
    restarted = [*samples[:4], CounterSample(4.0, 8.0, 400.0, 63000.0)]
    assert prompt_tokens_per_period(restarted, 0.0, 4.0, 1.0) is None
    unexported = [CounterSample(float(t), t * 2.0, 100.0) for t in range(5)]
    assert prompt_tokens_per_period(unexported, 0.0, 4.0, 1.0) is None


# -- the burst factor --------------------------------------------------------------------------


def _per_second(arrival_s: np.ndarray, prompts: np.ndarray, span_s: int) -> np.ndarray:
    return np.bincount(arrival_s.astype(int), weights=prompts, minlength=span_s)[:span_s]


def _factor(arrival_s: np.ndarray, prompts: np.ndarray, span_s: int) -> float | None:
    tracker = BurstTracker()
    per_s = _per_second(arrival_s, prompts, span_s)
    for start in range(0, span_s, 30):
        tracker.add(per_s[start : start + 30], 1.0)
    cv = float(prompts.std() / prompts.mean())
    reading = tracker.reading(float(prompts.mean()), cv)
    return None if reading is None else reading.factor


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_a_poisson_stream_gets_no_burst_factor(seed: int) -> None:
    rng = np.random.default_rng(seed)
    span = 300
    arrivals = np.cumsum(rng.exponential(1.0 / 8.0, 4000))
    arrivals = arrivals[arrivals < span]
    prompts = rng.lognormal(np.log(1024.0) - 0.5 * np.log(1 + 1.5**2),
                            np.sqrt(np.log(1 + 1.5**2)), arrivals.size)  # fmt: skip
    assert _factor(arrivals, prompts, span) == 1.0


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_bursts_beyond_poisson_read_above_one(seed: int) -> None:
    # The replay suite's bursty trace: 1 req/s Poisson plus bursts of 20-60 every 5 s on
    # average; the same mean rate as Poisson, far more tokens in a busy 5 s.
    rng = np.random.default_rng(seed)
    span = 300
    parts = [rng.uniform(0.0, span, rng.poisson(span))]
    start = 0.0
    while (start := start + float(rng.exponential(5.0))) < span - 1.0:
        parts.append(start + rng.uniform(0.0, 1.0, int(rng.integers(20, 61))))
    arrivals = np.sort(np.concatenate(parts))
    prompts = np.full(arrivals.size, 1024.0)
    factor = _factor(arrivals, prompts, span)
    assert factor is not None and 1.3 < factor <= MAX_BURST_FACTOR


def test_too_few_bins_or_no_tokens_say_nothing() -> None:
    tracker = BurstTracker()
    tracker.add(np.full(5 * (MIN_BINS - 1), 100.0), 1.0)
    assert tracker.reading(1024.0, 1.0) is None
    tracker.add(np.full(5, 100.0), 1.0)
    assert tracker.reading(1024.0, 1.0) is not None
    assert tracker.reading(None, 1.0) is None
    idle = BurstTracker()
    idle.add(np.zeros(300), 1.0)
    assert idle.reading(1024.0, 1.0) is None
    # 4 requests of 1024 tokens a bin: the p95 of a Poisson count of 4 is about 7.3.
    assert poisson_quantile_tokens(4096.0, 1024.0, 0.0) == pytest.approx(4096 + 1.645 * 2048)
