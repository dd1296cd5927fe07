"""Per percentile target of a closed loop: the share of judged windows (a replay's, or those
outside loading) in which the trailing percentile missed it, the share in which our decision
said the model cannot meet it at replicas.max (exporter/sizing/feasibility.py), and the share
the simulator with the true parameters at replicas.max misses: a claim of infeasibility holds
only when that share is above MAX_MISSED_SHARE."""

from __future__ import annotations

from typing import Any

import numpy as np

from bench.lib.closed_loop_report import Run

MAX_MISSED_SHARE = 0.05  # a target met in all but this share of judged windows is met


def _missed(found: list[float | None], run: Run, target_ms: float) -> list[bool | None]:
    """Per window: missed, met, or None when not judged (loading, or no observation)."""
    return [
        None if c.loading or v is None else v > target_ms
        for c, v in zip(run.cycles, found, strict=True)
    ]


def series_missed(series: dict[str, list[Any]], key: str, target_ms: float) -> list[bool | None]:
    """Per window of a replay scorecard's series (exporter/replay/scoring.py): missed, met, or
    None when not judged (before the first judged window, or no observation)."""
    return [
        None if not judged or v is None else v > target_ms
        for judged, v in zip(series["judged"], series[key], strict=True)
    ]


def target_row(
    seed: int,
    name: str,
    mine: list[bool | None],
    said: list[bool],
    fixed: list[bool | None],
) -> dict[str, Any]:
    """One target's row for one seed: `mine` and `fixed` per window missed / met / not judged
    (ours, the simulator at replicas.max), `said` per window our decision's infeasible claim."""
    judged = [m for m in mine if m is not None]
    n = max(len(judged), 1)
    unexplained = sum(1 for m, s in zip(mine, said, strict=True) if m and not s)
    fixed_judged = [m for m in fixed if m is not None]
    return {
        "seed": seed, "target": name, "judged_windows": len(judged),
        "missed_pct": 100.0 * sum(judged) / n,
        "missed_not_said_infeasible_pct": 100.0 * unexplained / n,
        "said_infeasible_pct": 100.0 * sum(s for m, s in zip(mine, said, strict=True)
                                           if m is not None) / n,
        "at_max_missed_pct": 100.0 * sum(fixed_judged) / max(len(fixed_judged), 1),
    }  # fmt: skip


def target_rows(
    ours: Run,
    at_max: Run,
    names: tuple[str, ...],
    targets_ms: tuple[float, ...],
    trailing: tuple[list[tuple[float | None, ...]], list[tuple[float | None, ...]]],
    seed: int,
) -> list[dict[str, Any]]:
    """One row per target for one seed; `trailing` the per-window percentiles of both runs in
    the order of `names`."""
    rows = []
    for k, (name, target_ms) in enumerate(zip(names, targets_ms, strict=True)):
        mine = _missed([w[k] for w in trailing[0]], ours, target_ms)
        fixed = _missed([w[k] for w in trailing[1]], at_max, target_ms)
        said = [name in found for found in ours.infeasible] or [False] * len(mine)
        rows.append(target_row(seed, name, mine, said, fixed))
    return rows


def verdict(row: dict[str, float]) -> str:
    """Met, infeasible (the claim checked on the simulator at replicas.max), or missed."""
    limit = 100.0 * MAX_MISSED_SHARE
    if row["missed_pct"] <= limit:
        return "met"
    if row["said_infeasible_pct"] > 0 and row["missed_not_said_infeasible_pct"] <= limit:
        holds = row["at_max_missed_pct"] > limit
        return "infeasible (checked)" if holds else "infeasible (claim fails at max)"
    return "missed"


def target_table(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per target: the mean over seeds of each share, and its verdict."""
    keys = ("missed_pct", "missed_not_said_infeasible_pct", "said_infeasible_pct",
            "at_max_missed_pct")  # fmt: skip
    table: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(r["target"] for r in rows):
        mine = [r for r in rows if r["target"] == name]
        entry: dict[str, Any] = {k: float(np.mean([r[k] for r in mine])) for k in keys}
        entry["worst_seed_missed_pct"] = float(max(r["missed_pct"] for r in mine))
        entry["verdict"] = verdict(entry)
        table[name] = entry
    return table


def print_target_table(
    table: dict[str, dict[str, Any]], seeds: int, max_replicas: int | None
) -> None:
    """The per-target table of `target_table`."""
    if not table:
        return
    print(f"\nper target, share of judged windows, mean of {seeds} seeds; simulator "
          f"at replicas.max = {max_replicas} with the true parameters")  # fmt: skip
    print(f"{'target':>20} {'missed':>8} {'said infeasible':>16} {'at max missed':>14}  verdict")
    for name, row in table.items():
        print(f"{name:>20} {row['missed_pct']:7.1f}% {row['said_infeasible_pct']:15.1f}% "
              f"{row['at_max_missed_pct']:13.1f}%  {row['verdict']}")  # fmt: skip
