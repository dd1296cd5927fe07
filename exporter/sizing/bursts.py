"""Bursts measured before they miss (issue 38): the prompt tokens a deployment takes in per 5 s,
against what a Poisson stream of the same rate and prompt lengths would bring.

Where per-second readings exist (the sidecar's sampler, exporter.collector.arrival_sampler; in
replay, the simulated pods' own seconds), the seconds are added up into BIN_S bins and the
last BURST_BINS bins kept. The burst statistic is their QUANTILE: the prompt tokens a TTFT
queues behind in a busy 5 s. A Poisson stream of the same mean with the measured prompt-length
CV has a p95 of m mu + Z x m sqrt(mu (1 + cv^2)) tokens per bin (mu requests of mean length m:
a compound Poisson sum), which the model's TTFT already prices in; the ratio of the measured to
that is the burst factor: 1 at or below TOLERANCE (the noise of the quantile of BURST_BINS
bins), else the ratio (at most MAX_BURST_FACTOR). It is measured and exported
(`vllm_sizer_prompt_burst_factor`), not sized with. Sized with as a factor on the rate (the
TTFT sized at the rate x the factor), it took the replay suite's bursty trace from 98 % of
windows met at 1.15x the best fixed fleet to 82 % at 1.99x: the hand-over's prior sized 2x the
rate at 12 replicas, and a rate multiplied for bursts is no rate the model's steady-state
capacity, the evidence envelope or the hold on a fleet serving its load with margin can be
compared with. Sizing a TTFT for the bursts needs the model to price a burst of tokens queued
at once, which it does not yet.

In Prometheus mode there are no per-second readings (scrapes come every 15-30 s, a window's
rate is an average over bursts): what stands in is the latency histograms' observed tails,
whose misses feed the headroom factor's integral action (exporter.sizing.headroom).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

BIN_S = 5.0
BURST_BINS = 60  # 5 minutes of 5-s bins: ten 30-s windows
MIN_BINS = 24  # fewer bins' quantile says nothing (two minutes)
QUANTILE = 0.95
Z = 1.645  # the standard normal's QUANTILE
# A measured quantile within this ratio of the Poisson one is its noise: 60 Poisson bins' p95
# spreads about 10 % around the true one at a few requests per bin.
TOLERANCE = 1.15
MAX_BURST_FACTOR = 4.0  # the headroom factor's own bound (exporter.sizing.headroom)


@dataclass(frozen=True, slots=True)
class BurstReading:
    """The measured and the Poisson QUANTILE of prompt tokens per BIN_S, and their ratio
    where beyond TOLERANCE (1: no burst beyond Poisson)."""

    quantile_tokens: float
    poisson_tokens: float
    factor: float


def poisson_quantile_tokens(mean_tokens: float, mean_prompt: float, prompt_cv: float) -> float:
    """QUANTILE of the prompt tokens per bin of a Poisson stream bringing `mean_tokens` per bin
    in prompts of mean `mean_prompt` and CV `prompt_cv` (normal approximation)."""
    requests = mean_tokens / mean_prompt
    return mean_tokens + Z * mean_prompt * math.sqrt(requests * (1.0 + prompt_cv**2))


class BurstTracker:
    """One deployment's per-second prompt tokens, as BIN_S bins over the last BURST_BINS."""

    def __init__(self) -> None:
        self._bins: deque[float] = deque(maxlen=BURST_BINS)

    def add(self, tokens: np.ndarray, period_s: float) -> None:
        """One window's prompt tokens per `period_s` (oldest first); a trailing part shorter
        than a bin is dropped (the windows are whole bins at the 30-s default cycle)."""
        per_bin = max(1, round(BIN_S / period_s))
        whole = tokens.size // per_bin * per_bin
        if whole:
            self._bins.extend(tokens[:whole].reshape(-1, per_bin).sum(axis=1).tolist())

    def reading(self, mean_prompt: float | None, prompt_cv: float | None) -> BurstReading | None:
        """The burst statistic and factor (None: too few bins, no prompt tokens, or no mean
        prompt length to compare with)."""
        if len(self._bins) < MIN_BINS or mean_prompt is None or mean_prompt <= 0:
            return None
        bins = np.array(self._bins, dtype=np.float64)
        mean = float(bins.mean())
        if mean <= 0:
            return None
        measured = float(np.quantile(bins, QUANTILE))
        poisson = poisson_quantile_tokens(mean, mean_prompt, prompt_cv or 0.0)
        ratio = measured / poisson
        factor = min(ratio, MAX_BURST_FACTOR) if ratio > TOLERANCE else 1.0
        return BurstReading(measured, poisson, factor)
