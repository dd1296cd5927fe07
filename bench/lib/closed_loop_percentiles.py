"""Closed loop on percentile targets (issue 18 part 5): the TTFT-bound profile with a TTFT p95
and a per-token ITL p99 target.

Arms (bench/closed_loop.py runs each on the same trace per seed):
- percentile: our daemon sized on the percentile targets;
- mean-matched: our daemon on mean targets = scale x the percentile targets' values, the scale
  searched per seed until the arm's replica-hours equal the percentile arm's within 3 %
  (`match_cost`: regula falsi on log scale between two bracketing scales, at most
  `MAX_SEARCH_RUNS` runs; the closest run is kept when the step function of replica counts
  never lands within 3 %, and the JSON says so);
- throughput: the decode-throughput analyzer (it sees no targets).
Metric: the share of cycles whose trailing 5-minute p95 TTFT (requests whose first token came
out in the 5 minutes) or p99 per-token ITL (gaps emitted in the 5 minutes) exceeds the target,
outside the windows in which a replica asked for was still loading.

The scenario is data (`PERCENTILE_SCENARIOS`); scoring and the cost search are functions of a
`Run`, so another driver of the same arms can reuse them.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from bench.lib.closed_loop_report import Run
from bench.lib.envelope import RunStart, with_run
from bench.lib.percentile_sim import weighted_quantiles
from bench.lib.percentile_targets import print_target_table, target_rows, target_table
from exporter.config.values import SloConfig
from exporter.replay.report import json_safe
from model import LatencyMetric, PercentileTarget

TRAILING_S = 300.0  # the trailing window of the observed percentiles
COST_TOLERANCE = 0.03  # replica-hours of the mean arm within 3 % of the percentile arm's
MAX_SEARCH_RUNS = 6


@dataclass(frozen=True, slots=True)
class PercentileScenario:
    """A Table III profile with percentile targets (ms) and the scale bracket of the search."""

    name: str
    base: str  # the name of the mean-target scenario whose profile and lengths are replayed
    ttft_p95_ms: float
    itl_p99_ms: float
    scale_lo: float  # mean targets = scale x the percentile targets; lo: tight (more replicas)
    scale_hi: float

    def percentile_slo(self) -> SloConfig:
        return SloConfig(
            percentiles=(
                PercentileTarget(LatencyMetric.TTFT, 0.95, self.ttft_p95_ms),
                PercentileTarget(LatencyMetric.ITL_PER_TOKEN, 0.99, self.itl_p99_ms),
            )
        )

    def mean_slo(self, scale: float) -> SloConfig:
        return SloConfig(ttft_ms=scale * self.ttft_p95_ms, itl_ms=scale * self.itl_p99_ms)


PERCENTILE_SCENARIOS = (PercentileScenario("ttft-bound-p95", "ttft-bound", 100.0, 40.0, 0.2, 1.0),)


def replica_hours(run: Run) -> float:
    """Provisioned replica-hours over the run (each cycle's count for its window)."""
    if len(run.cycles) < 1:
        return 0.0
    window_s = run.cycles[0].end_s
    return sum(c.provisioned for c in run.cycles) * window_s / 3600.0


def trailing_percentiles(run: Run) -> list[tuple[float | None, float | None]]:
    """Per cycle: p95 TTFT and p99 per-token ITL (ms) over the trailing TRAILING_S (None when
    no request / gap fell in it)."""
    req = run.requests
    assert req is not None, "run_arm keeps the requests"
    out: list[tuple[float | None, float | None]] = []
    for k, cycle in enumerate(run.cycles):
        lo = cycle.end_s - TRAILING_S
        with np.errstate(invalid="ignore"):
            firsts = (req.first_token_s > lo) & (req.first_token_s <= cycle.end_s)
        ttft = req.ttft_ms[firsts]
        p95 = weighted_quantiles(ttft, np.ones_like(ttft), (0.95,))[0] if ttft.size else None
        first_window = max(0, k + 1 - int(round(TRAILING_S / window_of(run))))
        parts = run.window_gaps[first_window : k + 1]
        gaps = np.concatenate([g for g, _ in parts])
        weights = np.concatenate([w for _, w in parts])
        p99 = weighted_quantiles(gaps, weights, (0.99,))[0] if gaps.size else None
        out.append((p95, p99))
    return out


def window_of(run: Run) -> float:
    """The cycle period (s) of a run."""
    return run.cycles[0].end_s


def score(run: Run, scenario: PercentileScenario) -> dict[str, float]:
    """Cycles over each target outside loading windows, as counts and shares, and the cost."""
    found = trailing_percentiles(run)
    outside = [not c.loading for c in run.cycles]
    ttft_over = sum(1 for (t, _), o in zip(found, outside, strict=True)
                    if o and t is not None and t > scenario.ttft_p95_ms)
    itl_over = sum(1 for (_, i), o in zip(found, outside, strict=True)
                   if o and i is not None and i > scenario.itl_p99_ms)
    any_over = sum(
        1 for (t, i), o in zip(found, outside, strict=True)
        if o and ((t is not None and t > scenario.ttft_p95_ms)
                  or (i is not None and i > scenario.itl_p99_ms))
    )
    n = max(sum(outside), 1)
    return {
        "cycles": len(run.cycles),
        "cycles_outside_loading": sum(outside),
        "ttft_p95_over": ttft_over,
        "itl_p99_over": itl_over,
        "any_over": any_over,
        "ttft_p95_over_pct": 100.0 * ttft_over / n,
        "itl_p99_over_pct": 100.0 * itl_over / n,
        "any_over_pct": 100.0 * any_over / n,
        "replica_hours": replica_hours(run),
        "mean_replicas": float(np.mean([c.provisioned for c in run.cycles])),
    }


def match_cost(
    run_at: Callable[[float], Run], target_hours: float, lo: float, hi: float
) -> tuple[Run, float, list[dict[str, Any]]]:
    """The run at the scale whose replica-hours are closest to target_hours, that scale, and
    every (scale, hours) tried. Replica-hours fall as the scale (looser targets) rises."""
    tried: list[dict[str, Any]] = []
    best: tuple[float, Run, float] | None = None

    def attempt(scale: float) -> float:
        nonlocal best
        run = run_at(scale)
        hours = replica_hours(run)
        tried.append({"scale": scale, "replica_hours": hours})
        gap = abs(hours - target_hours) / target_hours
        if best is None or gap < best[0]:
            best = (gap, run, scale)
        return hours

    h_lo, h_hi = attempt(lo), attempt(hi)
    while len(tried) < MAX_SEARCH_RUNS and best is not None and best[0] > COST_TOLERANCE:
        if not h_hi <= target_hours <= h_lo or h_lo == h_hi:
            break  # the bracket does not contain the target: keep the closest
        # Regula falsi on log(scale); replica-hours are a step function of it.
        f = (h_lo - target_hours) / (h_lo - h_hi)
        mid = math.exp(math.log(lo) + f * (math.log(hi) - math.log(lo)))
        if not lo < mid < hi:
            mid = math.sqrt(lo * hi)
        h_mid = attempt(mid)
        if h_mid >= target_hours:
            lo, h_lo = mid, h_mid
        else:
            hi, h_hi = mid, h_mid
    assert best is not None
    return best[1], best[2], tried


RunArm = Callable[..., Run]  # (throughput?, our SLO, seed[, fixed replicas]) -> run
RunBase = Callable[..., Run]  # (base scenario name, throughput?, our SLO, seed[, fixed]) -> run


def run_percentile_scenarios(
    only: str | None,
    seeds: list[int],
    out: Path | None,
    begun: RunStart,
    run: RunBase,
    max_replicas: int,
) -> None:
    """Every percentile scenario (or the one named `only`), its JSON written to `out`; the
    simulator at `max_replicas` (true parameters) checks each infeasible claim."""
    for pct in PERCENTILE_SCENARIOS:
        if only not in (None, pct.name):
            continue
        started = time.perf_counter()
        found = run_scenario(pct, seeds, partial(run, pct.base), max_replicas)
        found["wall_s"] = time.perf_counter() - started
        if out is not None:
            payload = with_run(begun, {"seeds": seeds, **found})
            out.write_text(json.dumps(json_safe(payload), indent=1))
            print(f"wrote {out}")


def _mean_runs(run: RunArm, scenario: PercentileScenario, seed: int) -> Callable[[float], Run]:
    """Our arm on the mean targets at a scale, on this seed's trace."""
    return lambda scale: run(False, scenario.mean_slo(scale), seed)


def run_scenario(
    scenario: PercentileScenario, seeds: list[int], run: RunArm, max_replicas: int | None = None
) -> dict[str, Any]:
    """The three arms over the seeds: per-run scores, the cost search, and per-arm spreads;
    with `max_replicas`, each target's judged windows missed and whether it is infeasible by
    the rule of exporter/sizing/feasibility.py, checked on the simulator at max_replicas."""
    runs: list[dict[str, Any]] = []
    targets: list[dict[str, Any]] = []
    for seed in seeds:
        pct = run(False, scenario.percentile_slo(), seed)
        if max_replicas is not None:
            at_max = run(True, None, seed, max_replicas)
            names = tuple(t.name for t in scenario.percentile_slo().percentiles)
            found = (trailing_percentiles(pct), trailing_percentiles(at_max))
            targets_ms = (scenario.ttft_p95_ms, scenario.itl_p99_ms)
            targets.extend(target_rows(pct, at_max, names, targets_ms, found, seed))
        hours = replica_hours(pct)
        matched, scale, tried = match_cost(
            _mean_runs(run, scenario, seed),
            hours,
            scenario.scale_lo,
            scenario.scale_hi,
        )
        thr = run(True, None, seed)
        for arm, r, extra in (
            ("percentile", pct, {}),
            ("mean-matched", matched, {"scale": scale, "search": tried}),
            ("throughput", thr, {}),
        ):
            s = score(r, scenario)
            runs.append({"arm": arm, "seed": seed, "summary": s, **extra})
            print(
                f"  {scenario.name} seed {seed} {arm:>12}: over p95 TTFT "
                f"{s['ttft_p95_over']}, p99 ITL {s['itl_p99_over']} of "
                f"{s['cycles_outside_loading']} cycles outside loading, "
                f"{s['replica_hours']:.2f} replica-hours"
                + (f" (scale {scale:.3f}, {len(tried)} runs)" if arm == "mean-matched" else ""),
                flush=True,
            )
    table: dict[str, dict[str, float]] = {}
    for arm in ("percentile", "mean-matched", "throughput"):
        mine = [r["summary"] for r in runs if r["arm"] == arm]
        table[arm] = {
            key: float(np.mean([m[key] for m in mine]))
            for key in ("ttft_p95_over_pct", "itl_p99_over_pct", "any_over_pct",
                        "ttft_p95_over", "itl_p99_over", "replica_hours", "mean_replicas")
        }
    print_percentile_table(scenario, table, len(seeds))
    per_target = target_table(targets)
    print_target_table(per_target, len(seeds), max_replicas)
    return {"scenario": scenario_dict(scenario), "table": table, "runs": runs,
            "targets": per_target, "target_runs": targets}  # fmt: skip


def scenario_dict(scenario: PercentileScenario) -> dict[str, Any]:
    return {
        "name": scenario.name, "base": scenario.base, "ttft_p95_ms": scenario.ttft_p95_ms,
        "itl_p99_ms": scenario.itl_p99_ms, "scale_lo": scenario.scale_lo,
        "scale_hi": scenario.scale_hi, "trailing_s": TRAILING_S,
        "cost_tolerance": COST_TOLERANCE,
    }


def print_percentile_table(
    scenario: PercentileScenario, table: dict[str, dict[str, float]], seeds: int
) -> None:
    print(
        f"\n{scenario.name}: TTFT p95 <= {scenario.ttft_p95_ms:g} ms, per-token ITL p99 <= "
        f"{scenario.itl_p99_ms:g} ms; trailing {TRAILING_S:.0f} s, outside loading, "
        f"mean of {seeds} seeds"
    )
    print(f"{'arm':>14} {'p95 TTFT over':>14} {'p99 ITL over':>13} {'any over':>9} "
          f"{'replica-h':>10}")
    for arm, row in table.items():
        print(f"{arm:>14} {row['ttft_p95_over_pct']:13.1f}% {row['itl_p99_over_pct']:12.1f}% "
              f"{row['any_over_pct']:8.1f}% {row['replica_hours']:10.2f}")
