"""Records, Table V reference figures, printed tables and plots of the closed-loop bench
(bench/closed_loop.py, issue 8 part 4)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from model.simulation.simulator import SimResult

FloatArray = NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Scenario:
    """One Table III scenario: base rate (req/s), mean lengths, SLO targets (ms)."""

    name: str
    base_rps: float
    input_tokens: int
    output_tokens: int
    ttft_ms: float
    itl_ms: float
    binding: str  # the target the scenario is built to bind: "ttft" or "itl"
    lengths: str = "uniform"  # LengthKind of both lengths (uniform: on [x/2, 3x/2])
    length_cv: float = 0.0  # their CV where the law takes one (lognormal)


# Paper Table V (one run per arm, ~42 s cycles); None where the paper gives no figure.
PAPER_TABLE_V: dict[str, dict[str, dict[str, float | None]]] = {
    "ttft-bound": {
        "queueing": {
            "cycles": 64,
            "mean_replicas": 1.88,
            "peak_replicas": 3,
            "ttft_median_ms": 43.8,
            "ttft_p90_ms": 50.6,
            "ttft_worst_ms": 73.4,
            "ttft_over": 7,
            "itl_over": 0,
            "any_over": 7,
            "any_over_pct": 100 * 7 / 64,
            "itl_median_ms": None,
            "itl_p90_ms": None,
            "itl_worst_ms": None,
            "kv_min": 0.05,
            "kv_max": 0.40,
            "peak_queue": 0,
        },
        "throughput": {
            "cycles": 64,
            "mean_replicas": 1.81,
            "peak_replicas": 5,
            "ttft_median_ms": 44.5,
            "ttft_p90_ms": 85.1,
            "ttft_worst_ms": 7767.0,
            "ttft_over": 22,
            "itl_over": 3,
            "any_over": 22,
            "any_over_pct": 100 * 22 / 64,
            "itl_median_ms": None,
            "itl_p90_ms": None,
            "itl_worst_ms": None,
            "kv_min": 0.04,
            "kv_max": 0.74,
            "peak_queue": 194,
        },
    },
    "itl-bound": {
        "queueing": {
            "cycles": 63,
            "mean_replicas": 2.27,
            "peak_replicas": 3,
            "ttft_median_ms": None,
            "ttft_p90_ms": None,
            "ttft_worst_ms": None,
            "ttft_over": 0,
            "itl_over": 0,
            "any_over": 0,
            "any_over_pct": 100 * 0 / 63,
            "itl_median_ms": 8.3,
            "itl_p90_ms": 9.3,
            "itl_worst_ms": 9.5,
            "kv_min": 0.04,
            "kv_max": 0.15,
            "peak_queue": 0,
        },
        "throughput": {
            "cycles": 64,
            "mean_replicas": 1.64,
            "peak_replicas": 2,
            "ttft_median_ms": None,
            "ttft_p90_ms": None,
            "ttft_worst_ms": None,
            "ttft_over": 0,
            "itl_over": 5,
            "any_over": 5,
            "any_over_pct": 100 * 5 / 64,
            "itl_median_ms": 9.0,
            "itl_p90_ms": 12.7,
            "itl_worst_ms": 17.2,
            "kv_min": 0.06,
            "kv_max": 0.48,
            "peak_queue": 0,
        },
    },
}


@dataclass(slots=True)
class Cycle:
    """One window and the decision at its end (ms, req/s); None where nothing was observed."""

    end_s: float
    offered_rps: float
    arrival_rps: float
    provisioned: int  # replicas asked for during the window (starting + ready)
    ready: int
    desired: int
    reason: str
    tuner_state: str
    capacity_rps: float | None  # one replica's SLO capacity per the tuned model (queueing arms)
    ttft_ms: float | None
    itl_ms: float | None
    kv_usage_ratio: float
    peak_waiting: int
    loading: bool


@dataclass(slots=True)
class Run:
    """One arm on one scenario and seed."""

    scenario: str
    arm: str
    seed: int
    cycles: list[Cycle] = field(default_factory=list)
    params: dict[str, float] | None = None
    first_fit_s: float | None = None
    wall_s: float = 0.0
    # Per window: the per-token gaps (ms) and how many tokens had each; the requests at the end.
    window_gaps: list[tuple[FloatArray, FloatArray]] = field(default_factory=list)
    requests: SimResult | None = None
    # Our arms, per window: the targets the decision said the model misses at replicas.max.
    infeasible: list[tuple[str, ...]] = field(default_factory=list)


def spread(values: list[float]) -> dict[str, float]:
    """Mean, sample sd, min and max over seeds (NaNs left out)."""
    arr = np.array([v for v in values if not math.isnan(v)])
    if not arr.size:
        return {"mean": math.nan, "sd": math.nan, "min": math.nan, "max": math.nan}
    sd = float(arr.std(ddof=1)) if arr.size > 1 else 0.0
    return {"mean": float(arr.mean()), "sd": sd, "min": float(arr.min()), "max": float(arr.max())}


ROWS: tuple[tuple[str, str, str], ...] = (
    ("cycles", "cycles", "{:.0f}"),
    ("mean provisioned replicas", "mean_replicas", "{:.2f}"),
    ("peak provisioned replicas", "peak_replicas", "{:.0f}"),
    ("TTFT median (ms)", "ttft_median_ms", "{:.1f}"),
    ("TTFT p90 (ms)", "ttft_p90_ms", "{:.1f}"),
    ("TTFT worst (ms)", "ttft_worst_ms", "{:.0f}"),
    ("ITL median (ms)", "itl_median_ms", "{:.2f}"),
    ("ITL p90 (ms)", "itl_p90_ms", "{:.2f}"),
    ("ITL worst (ms)", "itl_worst_ms", "{:.2f}"),
    ("cycles over TTFT SLO", "ttft_over", "{:.1f}"),
    ("cycles over ITL SLO", "itl_over", "{:.1f}"),
    ("cycles over any SLO", "any_over", "{:.1f}"),
    ("  share of cycles (%)", "any_over_pct", "{:.1f}"),
    ("  cycles with a pod loading", "loading_cycles", "{:.1f}"),
    ("  over TTFT, outside loading", "ttft_over_outside_loading", "{:.1f}"),
    ("  over ITL, outside loading", "itl_over_outside_loading", "{:.1f}"),
    ("  over any, outside loading", "any_over_outside_loading", "{:.1f}"),
    ("  share outside loading (%)", "any_over_outside_loading_pct", "{:.1f}"),
    ("  over any, up-ramps (+90 s)", "any_over_in_ramps", "{:.1f}"),
    ("KV utilization min", "kv_min", "{:.2f}"),
    ("KV utilization max", "kv_max", "{:.2f}"),
    ("peak queue depth", "peak_queue", "{:.0f}"),
    ("tuner: first estimate at (s)", "first_fit_s", "{:.0f}"),
    ("tuner: cycles warming", "warming_cycles", "{:.1f}"),
)


def _cell(stats: dict[str, float], fmt: str, many: bool) -> str:
    if math.isnan(stats["mean"]):
        return "-"
    if not many:
        return fmt.format(stats["mean"])
    return (
        f"{fmt.format(stats['mean'])}±{fmt.format(stats['sd'])} "
        f"[{fmt.format(stats['min'])}-{fmt.format(stats['max'])}]"
    )


def print_table(scenario: Scenario, table: dict[str, dict[str, dict[str, float]]], n: int) -> None:
    arms = list(table)
    paper = PAPER_TABLE_V.get(scenario.name, {"queueing": {}, "throughput": {}})
    print(
        f"\n{scenario.name}: TTFT SLO {scenario.ttft_ms:g} ms, ITL SLO {scenario.itl_ms:g} ms, "
        f"base {scenario.base_rps * 60:g} RPM, {scenario.lengths} lengths"
        f"{f' CV {scenario.length_cv:g}' if scenario.length_cv else ''}; "
        f"{n} seed(s): mean±sd [min-max]"
    )
    head = f"{'':31}{'paper queue':>12}{'paper thru':>11}" + "".join(f"{a:>23}" for a in arms)
    print(head)
    for label, key, fmt in ROWS:
        cells = []
        for arm in ("queueing", "throughput"):
            value = paper[arm].get(key)
            integral = value is not None and float(value).is_integer()
            cells.append(
                "-" if value is None else f"{value:.0f}" if integral else fmt.format(value)
            )
        line = f"{label:31}{cells[0]:>12}{cells[1]:>11}"
        line += "".join(f"{_cell(table[a][key], fmt, n > 1):>23}" for a in arms)
        print(line)


def plot_runs(scenario: Scenario, runs: list[Run], path: Path) -> None:
    """Load, replicas, TTFT and ITL vs time for every arm of one scenario and seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 1, figsize=(10, 11), sharex=True)
    colors = {
        "queueing": "tab:blue",
        "throughput": "tab:red",
        "look-ahead": "tab:green",
    }
    t_min = [x.end_s / 60 for x in runs[0].cycles]
    axes[0].plot(t_min, [x.offered_rps for x in runs[0].cycles], "k--", label="offered")
    axes[0].plot(t_min, [x.arrival_rps for x in runs[0].cycles], "k-", lw=0.8, label="measured")
    axes[0].set_ylabel("load (req/s)")
    for run in runs:
        color = colors.get(run.arm, "tab:gray")
        t = [x.end_s / 60 for x in run.cycles]
        axes[1].step(
            t,
            [x.provisioned for x in run.cycles],
            where="pre",
            color=color,
            label=f"{run.arm} provisioned",
        )
        axes[1].plot(t, [x.ready for x in run.cycles], ":", color=color)
        for ax, key in ((axes[2], "ttft_ms"), (axes[3], "itl_ms")):
            values = [np.nan if getattr(x, key) is None else getattr(x, key) for x in run.cycles]
            ax.plot(t, values, ".-", color=color, lw=1, ms=3, label=run.arm)
    axes[1].set_ylabel("replicas (dotted: ready)")
    axes[2].axhline(scenario.ttft_ms, color="k", lw=0.8, ls="--", label="SLO")
    axes[2].set_yscale("log")
    axes[2].set_ylabel("window mean TTFT (ms)")
    axes[3].axhline(scenario.itl_ms, color="k", lw=0.8, ls="--", label="SLO")
    axes[3].set_ylabel("window mean ITL (ms)")
    axes[3].set_xlabel("time (min)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"closed loop, {scenario.name}, seed {runs[0].seed}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def print_combined(
    per_scenario: dict[str, Any], arms: list[str], seeds: list[int]
) -> dict[str, dict[str, dict[str, float]]]:
    """Cycles over any SLO summed over both scenarios, per arm (paper: 7/127 vs 27/128)."""
    print("\nboth scenarios, cycles over any SLO (paper: queueing 7/127, throughput 27/128)")
    out: dict[str, dict[str, dict[str, float]]] = {}
    for arm in arms:
        totals: dict[str, list[float]] = {
            "over": [],
            "cycles": [],
            "over_outside": [],
            "outside": [],
        }
        for seed in seeds:
            rows = [
                r["summary"]
                for sc in per_scenario.values()
                for r in sc["runs"]
                if r["arm"] == arm and r["seed"] == seed
            ]
            totals["over"].append(sum(r["any_over"] for r in rows))
            totals["cycles"].append(sum(r["cycles"] for r in rows))
            totals["over_outside"].append(sum(r["any_over_outside_loading"] for r in rows))
            totals["outside"].append(sum(r["cycles"] - r["loading_cycles"] for r in rows))
        out[arm] = {key: spread(values) for key, values in totals.items()}
        per_seed = ", ".join(
            f"{o:.0f}/{c:.0f} ({oo:.0f}/{co:.0f})"
            for o, c, oo, co in zip(
                totals["over"],
                totals["cycles"],
                totals["over_outside"],
                totals["outside"],
                strict=True,
            )
        )
        print(f"  {arm:>11}: all (outside loading) per seed: {per_seed}")
    return out


def table_columns(cycles: list[Cycle]) -> dict[str, list[Any]]:
    """Per-cycle records as columns, floats to 5 significant digits (JSON size)."""
    rows = [asdict(x) for x in cycles]
    return {
        key: [float(f"{r[key]:.5g}") if isinstance(r[key], float) else r[key] for r in rows]
        for key in rows[0]
    }
