"""A deployment's replica bounds and its scale_from_zero section: parsed, then checked together
(0 replicas needs scale_from_zero, which needs a Prometheus source)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from exporter.config.checks import KeyReader, choice, integer, number
from exporter.config.values import (
    MAX_IDLE_S,
    MAX_QUERY_CHARS,
    MAX_REPLICAS,
    DemandKind,
    ScaleFromZeroConfig,
    SourceConfig,
)

_BRACKETS = {")": "(", "]": "[", "}": "{"}


def replica_bounds(
    r: KeyReader,
    m: Mapping[str, Any],
    path: str,
    source: SourceConfig | None,
    *,
    variant: bool = False,
) -> tuple[int, int, ScaleFromZeroConfig | None]:
    """(replicas.min, replicas.max, scale_from_zero) of the deployment mapping `m` at `path`.
    A fleet `variant` may sit at 0 without scale_from_zero (the plan brings it back) and has
    a minimum of 0 by default."""
    rep = r.mapping(m.get("replicas"), f"{path}.replicas", {"min", "max"})
    low = r.get(
        rep, "min", f"{path}.replicas", integer(0), "must be an integer >= 0", 0 if variant else 1
    )
    high = r.get(
        rep,
        "max",
        f"{path}.replicas",
        integer(1, MAX_REPLICAS),
        f"must be an integer >= 1 and <= {MAX_REPLICAS}",
        10,
    )
    if high < low:
        r.fail(f"{path}.replicas.max", f"must be >= replicas.min ({low})", high)
    zero = _scale_from_zero(r, m.get("scale_from_zero"), f"{path}.scale_from_zero")
    central = source is None or source.prometheus_selector is not None
    if low == 0 and "scale_from_zero" not in m and not variant:
        r.fail(
            f"{path}.replicas.min",
            "0 needs a scale_from_zero section and a prometheus_selector source (without pods "
            "there is nothing to observe: an upstream demand query says when to come back)",
            low,
        )
    if "scale_from_zero" in m and not central:
        # At zero there is no pod for a sidecar to run in, nor one to scrape.
        r.fail(
            f"{path}.scale_from_zero",
            "needs a prometheus_selector source (central mode): a scrape source has no pod "
            "to read at zero",
            m["scale_from_zero"],
        )
    if zero is not None and low != 0:
        r.fail(f"{path}.replicas.min", "must be 0 with scale_from_zero", low)
    return low, high, zero


def _scale_from_zero(r: KeyReader, node: Any, path: str) -> ScaleFromZeroConfig | None:
    if node is None:
        return None
    m = r.mapping(node, path, {"demand_query", "idle_s", "demand"})
    if not m:
        r.fail(path, "must be a mapping with demand_query and idle_s", node)
        return None
    query = r.required(
        m,
        "demand_query",
        path,
        promql_expression,
        f"a PromQL expression of one value, at most {MAX_QUERY_CHARS} characters, with "
        "balanced brackets, e.g. 'sum(rate(router_requests_total[1m]))'",
    )
    idle = r.required(
        m,
        "idle_s",
        path,
        number(0.0, MAX_IDLE_S),
        f"a number > 0 and <= {MAX_IDLE_S:g} (seconds without demand before 0)",
    )
    kinds = tuple(k.value for k in DemandKind)
    rule = f"must be one of {', '.join(kinds)}"
    demand = r.get(m, "demand", path, choice(kinds), rule, DemandKind.RATE.value)
    if query is None or idle is None:
        return None
    return ScaleFromZeroConfig(demand_query=query, idle_s=idle, demand=DemandKind(demand))


def promql_expression(value: Any) -> str | None:
    """A plausible PromQL expression: text, not blank, bounded, brackets balanced outside
    quotes. Prometheus parses it; this catches what would fail every cycle anyway."""
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_QUERY_CHARS:
        return None
    if "\x00" in value:
        return None
    stack: list[str] = []
    quote: str | None = None
    escaped = False
    for char in value:
        if quote is not None:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = None
        elif char in "\"'`":
            quote = char
        elif char in "([{":
            stack.append(char)
        elif char in _BRACKETS and (not stack or stack.pop() != _BRACKETS[char]):
            return None
    return value if quote is None and not stack else None
