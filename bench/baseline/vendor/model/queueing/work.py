"""Work the refined variant adds to the paper's prefill and decode terms (ms). Refinements §6.

The paper charges a prompt of n tokens beta n of prefill compute and a request of m output tokens
gamma m (n + (m + 1) / 2) of KV reads. The refined variant adds prefill attention over the
n^2 / 2 causal (query, key) pairs, beta kappa E[n^2] / 2 (kappa from the architecture), and the
spread of the output length in the KV reads, gamma m^2 cv_m^2 / 2, with the second moments
E[n^2] = n^2 (1 + cv_n^2) and E[m^2] = m^2 (1 + cv_m^2). The decode term is the mean KV context
of a running request, n + E[m^2] / (2 E[m]): a longer output stays in the batch longer, so the
context decoding requests hold is length-biased, and every iteration slows (capacity falls).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from bench.baseline.vendor.model.queueing.params import ServiceParams
from bench.baseline.vendor.model.queueing.variant import ModelOptions

FloatArray = NDArray[np.float64]


def work_extras(
    params: ServiceParams, n: FloatArray, m: FloatArray, options: ModelOptions
) -> tuple[FloatArray, FloatArray]:
    """Per-request work (ms) the refined variant adds to W_pref and W_dec: prefill attention
    with length dispersion, and the dispersion of decode KV reads. Zero for the paper variant."""
    if not options.refined:
        return np.zeros_like(n), np.zeros_like(m)
    cv2n = options.input_length_cv**2
    cv2m = options.output_length_cv**2
    # beta kappa E[n^2]/2: attention over the n^2/2 causal (query, key) pairs of the prompt;
    # with a cached prefix h n only the uncached queries attend: n^2 (1 - h^2) / 2 pairs.
    hit2 = options.prefix_hit_ratio**2
    attention = params.beta_ms * options.attention_ratio * n * n * (1.0 + cv2n) * (1.0 - hit2) / 2.0
    # gamma (m n + (E[m^2] + m)/2) minus the paper's gamma m (n + (m+1)/2).
    decode = params.gamma_ms * m * m * cv2m / 2.0
    return attention, decode
