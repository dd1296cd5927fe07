"""The `slo` section of a deployment: mean and percentile targets, every bad key named.

    slo: {ttft: {p95_ms: 500}, itl: {mean_ms: 25, p99_ms: 80, kind: per_token}}

`ttft_ms` and `itl_ms` are the older spelling of `ttft.mean_ms` and `itl.mean_ms`. The ITL mean
is always the token-weighted mean gap (vLLM's inter_token_latency _sum/_count, what the tuner
fits); `itl.kind` says which ITL the percentile keys describe.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from exporter.config.checks import KeyReader, choice, join_key, number, shorten
from exporter.config.values import MAX_SLO_WINDOW_S, MIN_SLO_WINDOW_S, ItlKind, SloConfig
from model import LatencyMetric, PercentileTarget

# p50_ms ... p99.9_ms: percentiles from the median to the model's highest (0.999), one decimal.
MIN_PERCENTILE = 50.0
MAX_PERCENTILE = 99.9
_PERCENTILE_KEY = re.compile(r"p([0-9]{2}(?:\.[0-9])?)_ms")
_LOOKS_LIKE_PERCENTILE = re.compile(r"p.*_ms")
PERCENTILE_KEYS = "pNN_ms"  # how the unknown-key message names them
PERCENTILE_RULE = "unknown percentile, allowed p50..p99.9 (at most one decimal)"
TARGET_RULE = "must be a number > 0 (ms)"
ITL_KINDS = tuple(kind.value for kind in ItlKind)


def parse_slo(r: KeyReader, deployment: Mapping[str, Any], at: str) -> SloConfig:
    """The targets of the deployment at `at` (its `slo` and `slo_window_s` keys); problems go
    to `r`."""
    default = SloConfig().window_s
    window = r.get(
        deployment,
        "slo_window_s",
        at,
        number(MIN_SLO_WINDOW_S, MAX_SLO_WINDOW_S, inclusive=True),
        f"must be a number >= {MIN_SLO_WINDOW_S:g} and <= {MAX_SLO_WINDOW_S:g} (seconds)",
        default,
    )
    path = join_key(at, "slo")
    m = r.mapping(deployment.get("slo"), path, {"ttft_ms", "itl_ms", "ttft", "itl"})
    ttft = r.get(m, "ttft_ms", path, number(0.0), TARGET_RULE, None)
    itl = r.get(m, "itl_ms", path, number(0.0), TARGET_RULE, None)
    ttft_mean, ttft_targets = _section(r, m.get("ttft"), f"{path}.ttft", LatencyMetric.TTFT)
    kind = _itl_kind(r, m.get("itl"), f"{path}.itl")
    itl_mean, itl_targets = _section(r, m.get("itl"), f"{path}.itl", kind.metric)
    for name, old, new in (("ttft", ttft, ttft_mean), ("itl", itl, itl_mean)):
        if old is not None and new is not None:
            r.fail(
                f"{path}.{name}.mean_ms",
                f"sets the same mean target as {path}.{name}_ms; keep one of the two",
                new,
            )
    return SloConfig(
        ttft_ms=ttft if ttft is not None else ttft_mean,
        itl_ms=itl if itl is not None else itl_mean,
        percentiles=ttft_targets + itl_targets,
        window_s=window,
    )


def _itl_kind(r: KeyReader, node: Any, path: str) -> ItlKind:
    if not isinstance(node, Mapping):
        return ItlKind.PER_TOKEN
    value = r.get(
        node, "kind", path, choice(ITL_KINDS), f"must be one of {', '.join(ITL_KINDS)}", "per_token"
    )
    return ItlKind(value)


def _section(
    r: KeyReader, node: Any, path: str, metric: LatencyMetric
) -> tuple[float | None, tuple[PercentileTarget, ...]]:
    """A metric's mean target and its percentile targets, ordered by percentile."""
    if not isinstance(node, Mapping):
        if node is not None:
            r.fail(path, "must be a mapping", node)
        return None, ()
    fixed = {"mean_ms", "kind"} if metric is not LatencyMetric.TTFT else {"mean_ms"}
    r.sections.setdefault(path, frozenset(fixed | {PERCENTILE_KEYS}))
    r.note(path, PERCENTILE_KEYS, f"{TARGET_RULE}, NN from p50 to p99.9 (one decimal at most)")
    targets: dict[float, PercentileTarget] = {}
    for key, value in node.items():
        if key in fixed:
            continue
        text = shorten(str(key))
        at = join_key(path, text)
        if not isinstance(key, str) or not _LOOKS_LIKE_PERCENTILE.fullmatch(key):
            allowed = ", ".join(sorted(fixed | {PERCENTILE_KEYS}))
            r.fail(at, f"unknown key (allowed: {allowed})", value)
            continue
        match = _PERCENTILE_KEY.fullmatch(key)
        percentile = float(match.group(1)) if match else None
        if percentile is None or not MIN_PERCENTILE <= percentile <= MAX_PERCENTILE:
            r.fail(at, PERCENTILE_RULE, value)
            continue
        target_ms = number(0.0)(value)
        if target_ms is None:
            r.fail(at, TARGET_RULE, value)
            continue
        if percentile in targets:
            r.fail(at, f"sets the same percentile as another key of {path}", value)
            continue
        targets[percentile] = PercentileTarget(metric, round(percentile / 100.0, 4), target_ms)
    mean = r.get(node, "mean_ms", path, number(0.0), TARGET_RULE, None)
    return mean, tuple(targets[p] for p in sorted(targets))
