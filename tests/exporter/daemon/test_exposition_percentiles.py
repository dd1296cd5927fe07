"""Percentile targets in the exposition: predicted and configured percentiles labelled by
`percentile` (and `kind` for ITL), never `quantile`; the binding target as an enum gauge."""

from __future__ import annotations

import math
import re

from prometheus_client import generate_latest

from exporter.sizing.attainment import ObservedAttainment
from exporter.sizing.slo_targets import BindingTarget, PredictedPercentile
from model import LatencyMetric, PercentileTarget
from tests.exporter.daemon.test_exposition import KEY, decision, exposition, status

TTFT_P95 = PercentileTarget(LatencyMetric.TTFT, 0.95, 500.0)
ITL_P99 = PercentileTarget(LatencyMetric.ITL_PER_TOKEN, 0.99, 80.0)
ITL_REQ_P999 = PercentileTarget(LatencyMetric.ITL_PER_REQUEST, 0.999, 30.0)


def percentile_status() -> object:
    predicted = (
        PredictedPercentile(TTFT_P95, 420.0, 0.97),
        PredictedPercentile(ITL_P99, 61.0, 0.995),
        PredictedPercentile(ITL_REQ_P999, math.inf, 0.0),
    )
    return status(
        decision=decision(
            binding_target=BindingTarget.ITL_PER_TOKEN_PERCENTILE, predicted_percentiles=predicted
        ),
        slo_percentiles=(TTFT_P95, ITL_P99, ITL_REQ_P999),
    )


def test_predicted_and_target_percentiles_in_seconds_by_percentile_and_kind() -> None:
    registry = exposition(percentile_status())  # type: ignore[arg-type]
    get = registry.get_sample_value
    ttft = {**KEY, "percentile": "95"}
    assert get("vllm_sizer_predicted_ttft_quantile_seconds", ttft) == 0.42
    assert get("vllm_sizer_slo_ttft_quantile_seconds", ttft) == 0.5
    token = {**KEY, "percentile": "99", "kind": "per_token"}
    assert get("vllm_sizer_predicted_itl_quantile_seconds", token) == 0.061
    assert get("vllm_sizer_slo_itl_quantile_seconds", token) == 0.08
    request = {**KEY, "percentile": "99.9", "kind": "per_request"}
    assert get("vllm_sizer_predicted_itl_quantile_seconds", request) == math.inf
    assert get("vllm_sizer_slo_itl_quantile_seconds", request) == 0.03
    attained = "vllm_sizer_predicted_slo_attainment_ratio"
    assert get(attained, {**KEY, "target": "ttft_p95"}) == 0.97
    assert get(attained, {**KEY, "target": "itl_per_request_p99.9"}) == 0.0
    text = generate_latest(registry).decode()
    assert not re.search(r"[{,](quantile|le)=", text)


def test_the_binding_target_is_one_series_per_value_with_the_current_at_1() -> None:
    registry = exposition(percentile_status())  # type: ignore[arg-type]
    seen = {
        t.value: registry.get_sample_value("vllm_sizer_binding_target", {**KEY, "target": t.value})
        for t in BindingTarget
    }
    current = BindingTarget.ITL_PER_TOKEN_PERCENTILE
    assert seen == {t.value: float(t is current) for t in BindingTarget}


def test_nothing_is_exported_without_sizing_or_percentile_targets() -> None:
    text = generate_latest(exposition(status())).decode()
    assert "vllm_sizer_binding_target{" not in text
    assert "quantile_seconds{" not in text


def test_observed_attainment_is_exact_or_a_bracket_and_the_window_counts_requests() -> None:
    seen = (
        ObservedAttainment(TTFT_P95, 0.97, 0.97, 1500.0),
        ObservedAttainment(ITL_P99, 0.981, 0.993, 90000.0),
    )
    registry = exposition(status(observed_attainment=seen, slo_window_requests=1500.0))
    get = registry.get_sample_value
    name = "vllm_sizer_observed_slo_attainment_ratio"
    assert get(name, {**KEY, "target": "ttft_p95", "bound": "exact"}) == 0.97
    assert get(name, {**KEY, "target": "ttft_p95", "bound": "lower"}) is None
    assert get(name, {**KEY, "target": "itl_per_token_p99", "bound": "lower"}) == 0.981
    assert get(name, {**KEY, "target": "itl_per_token_p99", "bound": "upper"}) == 0.993
    assert get("vllm_sizer_observed_slo_window_requests", KEY) == 1500.0
