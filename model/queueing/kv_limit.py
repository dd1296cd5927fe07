"""The batch the KV cache can hold: min(max_num_seqs, KV tokens / mean context).

vLLM admits a request only while its KV blocks fit; at the mean request shape the cache holds
KV / c requests, with c the mean context of a running request. A request's context grows from
n to n + m while it decodes, and a longer output stays in the batch longer, so the time-average
over running requests is length-biased: c = n + (E[m^2] / E[m] + 1) / 2 =
n + (m (1 + cv_m^2) + 1) / 2 (the KV context term of the refined work,
model/queueing/kernel/table.py).
"""

from __future__ import annotations

import math

from model.queueing.params import Workload
from model.queueing.validation import require_int_at_least, require_non_negative, require_positive


def mean_running_context_tokens(workload: Workload, output_length_cv: float = 0.0) -> float:
    """Mean KV tokens of a running request (prompt plus the length-biased half output)."""
    cv2 = require_non_negative("output_length_cv", output_length_cv) ** 2
    m = workload.avg_output_tokens
    return workload.avg_input_tokens + (m * (1.0 + cv2) + 1.0) / 2.0


def kv_batch_limit(
    kv_capacity_tokens: float,
    workload: Workload,
    max_batch_size: int,
    *,
    output_length_cv: float = 0.0,
) -> int:
    """min(max_batch_size, floor(KV tokens / mean running context)), at least 1."""
    require_positive("kv_capacity_tokens", kv_capacity_tokens)
    require_int_at_least("max_batch_size", max_batch_size, 1)
    held = math.floor(kv_capacity_tokens / mean_running_context_tokens(workload, output_length_cv))
    return max(1, min(max_batch_size, held))
