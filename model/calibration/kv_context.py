"""The output length's second moment from the KV cache a window's running requests hold.
percentiles.md §2.

A 1-2-5 token histogram does not say where two point masses sit inside their buckets: a bimodal
output law (80 % at 512, 20 % at 8192, CV 1.5) reads 1.33 from it (histogram.py). vLLM's
`kv_cache_usage_perc` times the cache's tokens is the KV that running requests hold; paired with
`num_requests_running` read at the same instant, summed over many such reads, their ratio is the
time-average context of a running request. A request holds its prompt plus the tokens it has
generated, and one with m output tokens runs about m iterations, so that average is
length-biased: c = E[n] + E[m^2] / (2 E[m]) (the refined model's KV work term; kv_limit.py).
With E[n] and E[m] exact from the histograms' sums and counts, this gives
cv_m^2 = 2 (c - E[n]) / E[m] - 1 whatever the buckets.

It fails in known directions, and is used only to raise the histogram's reading
(`combined_output_cv`), never to lower it:
- heavy tails: a time-average over a few minutes sees a fraction of the longest requests'
  lifetimes; lognormal CV 2 (128/2048) read 1.73-1.98 for 2.2 where the histogram read 2.16;
- prefix sharing: blocks shared by running requests count once, so c reads low by up to the
  hit ratio times E[n];
- prompt-heavy shapes: the prompt dominates c and the prefill iterations of long prompts weigh
  it up (4096/256 lognormal CV 1 read 1.5-1.7): the reading is not taken where E[n] exceeds
  MAX_INPUT_PER_OUTPUT times E[m] (the shapes it helps are output-heavy);
- saturation: preemptions free and recompute KV (the caller leaves such windows out).
Rounding to KV blocks (16 tokens) adds about 8 tokens to c: about 16 / E[m] to cv_m^2 (0.008
at E[m] = 2048), not corrected; a pod of several engines reports its fullest engine's usage
(vllm_metrics.py), which reads c high unless they are balanced. Read at every 30 s cycle end
over simulated runs of 20 000 requests at 128/2048 (Table I Llama, loads 0.3-0.85,
bench/workload_realism.py): bimodal 1.48-1.49 for 1.49-1.50 (histogram 1.32-1.33); lognormal
CV 1 0.98-1.03 for 0.99-1.03 (histogram 0.99-1.02); uniform 0.21-0.28 for 0.29 (histogram
0.47, kept: the KV reading only raises it); lognormal CV 2 1.73-1.86 for 1.91-2.20 (histogram
1.86-2.16, kept). Over the tracker's 10 windows on one emulated replica at load 0.3 (about 40
requests a window) the bimodal law reads 1.43-1.62 (tests/exporter/sizing/test_kv_output_cv.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from model.queueing.validation import require_non_negative

# E[n] / E[m] above which the KV reading is not taken: the prefill iterations of long prompts
# bias c up by a few % of E[n] (+5 % at 4096/256), 2 * 0.05 * E[n] / E[m] in cv_m^2 (at most
# 0.1 here), and the prompts' spread in c is noise divided by E[m] / 2 (10-window readings of
# lognormal CV 1 at 1024/512 ranged 0.78-1.20, where the histogram read 0.92-1.04).
MAX_INPUT_PER_OUTPUT = 1.0
# Running requests summed over the reads below which their mean context is noise.
MIN_RUNNING_REQUESTS = 20.0


@dataclass(frozen=True, slots=True)
class KvContext:
    """KV tokens held by running requests and the running requests, each summed over reads
    taken at the same instants (pods, window ends)."""

    kv_tokens: float
    running: float

    def __post_init__(self) -> None:
        require_non_negative("kv_tokens", self.kv_tokens)
        require_non_negative("running", self.running)

    def __add__(self, other: KvContext) -> KvContext:
        return KvContext(self.kv_tokens + other.kv_tokens, self.running + other.running)

    @property
    def mean_context_tokens(self) -> float | None:
        """The time-average context of a running request; None without running requests."""
        return self.kv_tokens / self.running if self.running > 0 else None


def kv_output_cv2(
    context: KvContext, mean_input_tokens: float, mean_output_tokens: float
) -> float | None:
    """cv_m^2 = 2 (c - E[n]) / E[m] - 1 (at least 0); None below MIN_RUNNING_REQUESTS running
    requests or where the prompt dominates the context (module docstring)."""
    c = context.mean_context_tokens
    if (
        c is None
        or context.running < MIN_RUNNING_REQUESTS
        or not mean_output_tokens > 0
        or mean_input_tokens > MAX_INPUT_PER_OUTPUT * mean_output_tokens
    ):
        return None
    return max(2.0 * (c - mean_input_tokens) / mean_output_tokens - 1.0, 0.0)


def combined_output_cv(histogram_cv: float | None, kv_cv2: float | None) -> float | None:
    """The output-length CV the model uses: the KV reading where it exceeds the histogram's,
    which then placed point masses too low in their buckets; else the histogram's (both of the
    KV reading's failures, long tails and shared prefixes, read low). None without a histogram
    reading: the KV one only corrects it."""
    if histogram_cv is None:
        return None
    if kv_cv2 is None:
        return histogram_cv
    return max(histogram_cv, math.sqrt(kv_cv2))
