"""The output length's second moment from the KV cache running requests hold."""

from __future__ import annotations

import math

import numpy as np
import pytest

from model.calibration.kv_context import (
    MAX_INPUT_PER_OUTPUT,
    MIN_RUNNING_REQUESTS,
    KvContext,
    combined_output_cv,
    kv_output_cv2,
)


def running_context(n: float, outputs: np.ndarray, requests: int) -> KvContext:
    """`requests` running requests whose contexts are those of a steady state: a request with
    m outputs runs m iterations with n + k - 1 tokens held at its k-th."""
    held = np.concatenate([n + np.arange(m) for m in outputs])
    mean = float(held.mean())
    return KvContext(mean * requests, float(requests))


def test_the_length_biased_context_gives_the_output_cv_whatever_the_buckets() -> None:
    # A bimodal law: 80 % at 512, 20 % at 8192, CV 1.5 (a histogram reads 1.33).
    outputs = np.array([512] * 4 + [8192])
    true_cv2 = float(np.var(outputs) / np.mean(outputs) ** 2)
    assert true_cv2 == pytest.approx(2.25)
    cv2 = kv_output_cv2(running_context(128, outputs, 200), 128.0, float(np.mean(outputs)))
    assert cv2 is not None and math.sqrt(cv2) == pytest.approx(1.5, abs=0.002)
    # A fixed length reads 0, never below.
    fixed = kv_output_cv2(running_context(128, np.array([2048]), 50), 128.0, 2048.0)
    assert fixed is not None and fixed == pytest.approx(0.0, abs=1e-3)
    assert kv_output_cv2(KvContext(100.0 * 50, 50.0), 128.0, 2048.0) == 0.0


def test_no_reading_where_it_is_noise_or_the_prompt_dominates() -> None:
    context = running_context(128, np.array([512, 8192]), 100)
    assert kv_output_cv2(context, 128.0, 0.0) is None
    few = KvContext(context.kv_tokens, MIN_RUNNING_REQUESTS - 1)
    assert kv_output_cv2(few, 128.0, 2048.0) is None
    assert kv_output_cv2(context, MAX_INPUT_PER_OUTPUT * 2048.0 + 1, 2048.0) is None
    assert kv_output_cv2(context, MAX_INPUT_PER_OUTPUT * 2048.0, 2048.0) is not None
    assert KvContext(0.0, 0.0).mean_context_tokens is None
    with pytest.raises(ValueError, match="running"):
        KvContext(1.0, -1.0)


def test_the_kv_reading_only_raises_the_histogram_reading() -> None:
    assert combined_output_cv(1.33, 1.5**2) == pytest.approx(1.5)
    assert combined_output_cv(2.16, 1.8**2) == 2.16  # a long tail the window did not see
    assert combined_output_cv(0.47, None) == 0.47
    assert combined_output_cv(None, 1.5**2) is None
    assert KvContext(10.0, 2.0) + KvContext(20.0, 3.0) == KvContext(30.0, 5.0)
