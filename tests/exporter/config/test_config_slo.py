"""The `slo` section: mean and percentile targets, and each bad key named by its path."""

from __future__ import annotations

from typing import Any

import pytest

from exporter.base.errors import ConfigError
from exporter.config.loader import parse_config
from model import LatencyMetric, PercentileTarget
from tests.exporter.config.test_config import minimal


def slo_of(slo: Any) -> Any:
    return parse_config(minimal(slo=slo)).deployments[0].slo


def test_the_documented_example_reads_as_percentile_and_mean_targets() -> None:
    itl = {"mean_ms": 25, "p99_ms": 80, "kind": "per_token"}
    slo = slo_of({"ttft": {"p95_ms": 500}, "itl": itl})
    assert slo.ttft_ms is None and slo.itl_ms == 25.0
    assert slo.percentiles == (
        PercentileTarget(LatencyMetric.TTFT, 0.95, 500.0),
        PercentileTarget(LatencyMetric.ITL_PER_TOKEN, 0.99, 80.0),
    )


def test_old_keys_stay_mean_targets() -> None:
    slo = slo_of({"ttft_ms": 50, "itl_ms": 25})
    assert (slo.ttft_ms, slo.itl_ms, slo.percentiles) == (50.0, 25.0, ())


def test_percentiles_are_ordered_and_the_kind_chooses_the_itl() -> None:
    slo = slo_of({"ttft": {"p99.9_ms": 900, "p50_ms": 100, "mean_ms": 80},
                  "itl": {"kind": "per_request", "p90_ms": 30}})  # fmt: skip
    assert slo.ttft_ms == 80.0
    assert [t.name for t in slo.percentiles] == ["ttft_p50", "ttft_p99.9", "itl_per_request_p90"]
    assert slo.percentiles[1].quantile == 0.999  # not 0.9990000000000001, which the model refuses


def test_per_token_is_the_default_itl_kind() -> None:
    (target,) = slo_of({"itl": {"p99_ms": 80}}).percentiles
    assert target.metric is LatencyMetric.ITL_PER_TOKEN


BAD_SLO = [
    (
        {"ttft": {"p101_ms": 500}},
        r"deployments\[0\]\.slo\.ttft\.p101_ms: unknown percentile, allowed p50\.\.p99\.9 "
        r"\(at most one decimal\), got 500",
    ),
    ({"ttft": {"p49_ms": 5}}, r"slo\.ttft\.p49_ms: unknown percentile"),
    ({"ttft": {"p99.99_ms": 5}}, r"slo\.ttft\.p99\.99_ms: unknown percentile"),
    ({"itl": {"pxx_ms": 5}}, r"slo\.itl\.pxx_ms: unknown percentile"),
    ({"ttft": {"p95_ms": 0}}, r"slo\.ttft\.p95_ms: must be a number > 0 \(ms\), got 0"),
    ({"ttft": {"p95_ms": "500ms"}}, r"slo\.ttft\.p95_ms: must be a number > 0 \(ms\), got '500ms'"),
    ({"ttft": {"p95": 5}}, r"ttft\.p95: unknown key \(allowed: mean_ms, pNN_ms\)"),
    ({"ttft": {"kind": "per_token"}}, r"slo\.ttft\.kind: unknown key \(allowed: mean_ms, pNN_ms\)"),
    ({"itl": {"kind": "per_gap"}}, r"slo\.itl\.kind: must be one of per_token, per_request, got"),
    ({"itl": {"mean_ms": -1}}, r"slo\.itl\.mean_ms: must be a number > 0 \(ms\), got -1"),
    ({"itl": 25}, r"deployments\[0\]\.slo\.itl: must be a mapping, got 25"),
    (
        {"ttft_ms": 50, "ttft": {"mean_ms": 60}},
        r"slo\.ttft\.mean_ms: sets the same mean target as deployments\[0\]\.slo\.ttft_ms",
    ),
    (
        {"ttft": {"p95_ms": 500, "p95.0_ms": 400}},
        r"slo\.ttft\.p95\.0_ms: sets the same percentile as another key",
    ),
]


@pytest.mark.parametrize(("slo", "pattern"), BAD_SLO)
def test_bad_slo_keys_are_named_with_their_path(slo: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        parse_config(minimal(slo=slo))


def test_every_bad_slo_key_is_reported_at_once() -> None:
    slo = {"ttft": {"p101_ms": 5, "p95_ms": -1}, "itl": {"kind": "x", "p1_ms": 3}}
    with pytest.raises(ConfigError) as info:
        parse_config(minimal(slo=slo))
    assert len(info.value.problems) == 4


def test_the_slo_window_defaults_to_five_minutes_and_is_at_least_that() -> None:
    assert slo_of({"ttft_ms": 50}).window_s == 300.0
    data = minimal(slo_window_s=900)
    assert parse_config(data).deployments[0].slo.window_s == 900.0
    for bad in (200, 3601, "5m"):
        with pytest.raises(ConfigError, match=r"deployments\[0\]\.slo_window_s: must be a number "
                           r">= 300 and <= 3600 \(seconds\)"):  # fmt: skip
            parse_config(minimal(slo_window_s=bad))
