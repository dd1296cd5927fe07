"""What the demo shows of a run: one line per cycle, the summary and the PNG (four panels with
warm-up and SLO-miss cycles shaded)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from model import ServiceParams, TunerReason
from model.calibration.verdict import TUNER_MESSAGES
from model.simulation.workloads import RateProfile


@dataclass(frozen=True, slots=True, kw_only=True)
class CycleRow:
    """One cycle of the demo, for the table, the summary and the plot; s, req/s, ms."""

    t_s: float
    true_rate_rps: float
    arrival_rate_rps: float | None
    current: int | None
    desired: int | None
    reason: str
    observed_ttft_ms: float | None
    predicted_ttft_ms: float | None
    observed_itl_ms: float | None
    predicted_itl_ms: float | None
    tuner: str
    tuner_reason: str
    params: ServiceParams | None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSetting:
    """The demo's fixed choices the report explains; ms and s."""

    slo_ttft_ms: float
    slo_itl_ms: float
    cycle_s: float
    startup_delay_s: float
    look_ahead_s: float
    true_params: ServiceParams


def warming(row: CycleRow) -> bool:
    """The tuner has no parameters yet: the count is held and nothing is predicted."""
    return row.tuner == "warming"


def missed(row: CycleRow, setting: RunSetting) -> bool:
    """The window's measured mean TTFT or ITL was over its target."""
    return (row.observed_ttft_ms or 0.0) > setting.slo_ttft_ms or (
        row.observed_itl_ms or 0.0
    ) > setting.slo_itl_ms


HEADER = (
    f"{'t min':>6} {'load rps':>8} {'est rps':>8} {'rep':>3} {'->':>2} {'want':>4} "
    f"{'TTFT obs/pred ms':>17} {'ITL obs/pred ms':>16}  {'tuner':25} reason"
)


def _num(value: float | None, width: int, digits: int = 1) -> str:
    if value is None:
        return "-".rjust(width)
    return ("inf" if math.isinf(value) else f"{value:.{digits}f}").rjust(width)


def line(r: CycleRow) -> str:
    """The cycle's table line: load, replicas current -> desired, latencies, tuner, reason."""
    tuner = r.tuner if r.tuner == "fitted" else f"{r.tuner} ({r.tuner_reason})"
    return (
        f"{r.t_s / 60:6.1f} {r.true_rate_rps:8.2f} {_num(r.arrival_rate_rps, 8, 2)} "
        f"{_num(r.current, 3, 0)} -> {_num(r.desired, 4, 0)} "
        f"{_num(r.observed_ttft_ms, 8)}/{_num(r.predicted_ttft_ms, 8)} "
        f"{_num(r.observed_itl_ms, 7)}/{_num(r.predicted_itl_ms, 8)}  {tuner:25} {r.reason}"
    )


def tuner_note(r: CycleRow) -> str:
    """The line printed the first time the tuner is in a state for a reason: what it means."""
    return f"{'':7}tuner {r.tuner}: {TUNER_MESSAGES[TunerReason(r.tuner_reason)]}"


def params_text(p: ServiceParams | None) -> str:
    if p is None:
        return "none"
    return f"alpha {p.alpha_ms:.3g} ms, beta {p.beta_ms:.3g} ms, gamma {p.gamma_ms:.3g} ms"


def _median_error(pairs: list[tuple[float | None, float | None]]) -> float | None:
    errors = [
        abs(p / o - 1.0)
        for o, p in pairs
        if o is not None and p is not None and o > 0 and math.isfinite(p)
    ]
    return float(np.median(errors)) if errors else None


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def summary(rows: list[CycleRow], setting: RunSetting, late_ticks: int, ticks: int) -> str:
    """The closing lines, each figure with what it means for sizing."""
    s = setting
    misses = [k for k, r in enumerate(rows) if missed(r, s)]
    # A window starts at the previous cycle: a replica it asked for was not serving yet.
    loading = [
        k for k in misses if k > 0 and (rows[k - 1].desired or 0) > (rows[k - 1].current or 0)
    ]
    warm = sum(1 for r in rows if warming(r))
    counts = [r.current for r in rows if r.current is not None]
    fitted = [r for r in rows if not warming(r)]
    ttft_err = _median_error([(r.observed_ttft_ms, r.predicted_ttft_ms) for r in fitted])
    itl_err = _median_error([(r.observed_itl_ms, r.predicted_itl_ms) for r in fitted])
    final = rows[-1].params if rows else None
    look = (
        f"look-ahead {s.look_ahead_s:g} s: sized for the load trend one startup delay ahead"
        if s.look_ahead_s > 0
        else "no look-ahead: sized for the current load"
    )
    lines = [
        "\nsummary",
        f"  {len(rows)} cycles of {s.cycle_s:g} s; {look}",
        f"  warm-up: {warm} cycles without parameters (the first fit needs 5 steady windows); "
        "the count is held meanwhile",
        f"  SLO misses: {len(misses)} of {len(rows)} cycles with mean TTFT > {s.slo_ttft_ms:g} ms "
        f"or ITL > {s.slo_itl_ms:g} ms; {len(loading)} of them while a replica asked for was "
        f"still loading (it serves {s.startup_delay_s:g} s after the request)",
        f"  replicas: mean {np.mean(counts):.2f}, peak {max(counts)} (the cost of meeting the "
        "targets)"
        if counts
        else "  replicas: -",
        f"  prediction error after warm-up: median TTFT {_pct(ttft_err)}, ITL {_pct(itl_err)} "
        "(predicted vs measured per cycle: sizing is as right as these)",
        f"  fitted parameters: {params_text(final)}",
        f"  true parameters:   {params_text(s.true_params)}",
    ]
    if final is not None:
        errors = [
            abs(f / t - 1.0)
            for f, t in zip(final.as_tuple(), s.true_params.as_tuple(), strict=True)
        ]
        names = ("alpha", "beta", "gamma")
        lines.append(
            "  parameter error: "
            + ", ".join(f"{n} {100 * e:.1f} %" for n, e in zip(names, errors, strict=True))
            + " (one request shape lets them trade off, e.g. a larger alpha for a smaller beta; "
            "sizing uses the predictions, so the error above is the one that matters)"
        )
    lines.append(
        f"  emulator: {late_ticks} late ticks of {ticks} (a busy machine makes them; they "
        "distort the emulated latencies)"
    )
    return "\n".join(lines)


def _spans(flags: list[bool], t_min: np.ndarray, window_min: float) -> list[tuple[float, float]]:
    """(start, end) minutes of each run of consecutive flagged cycles; a cycle's window ends at
    its time."""
    out: list[tuple[float, float]] = []
    for flag, end in zip(flags, t_min, strict=True):
        if not flag:
            continue
        start = float(end) - window_min
        if out and start <= out[-1][1] + window_min / 2:  # adjacent, give or take a late cycle
            out[-1] = (out[-1][0], float(end))
        else:
            out.append((start, float(end)))
    return out


def plot_run(rows: list[CycleRow], path: Path, profile: RateProfile, setting: RunSetting) -> None:
    """Load, replicas, TTFT and ITL (observed and predicted, with SLO lines) vs time; warm-up
    cycles shaded grey and cycles over a target shaded red, in every panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from exporter.base.plot_axes import integer_ticks

    t = np.array([r.t_s / 60 for r in rows])

    def series(values: list[float | None]) -> np.ndarray:
        return np.array([np.nan if v is None or math.isinf(v) else v for v in values], float)

    fig, axes = plt.subplots(4, 1, figsize=(10, 11.5), sharex=True)
    grid = np.linspace(0.0, t[-1] * 60 if len(t) else 1.0, 400)
    axes[0].plot(grid / 60, profile.rate_at(grid), color="0.6", label="offered load (true)")
    axes[0].plot(
        t, series([r.arrival_rate_rps for r in rows]), "o-", ms=3, label="arrival rate (estimated)"
    )
    axes[0].set(ylabel="req/s", title="load")
    axes[1].step(t, series([r.current for r in rows]), where="post", label="replicas serving")
    axes[1].step(
        t, series([r.desired for r in rows]), where="post", linestyle="--", label="recommended"
    )
    axes[1].set(ylabel="replicas", title="replicas")
    integer_ticks(axes[1])
    for ax, name, obs, pred, target in (
        (axes[2], "TTFT", [r.observed_ttft_ms for r in rows],
         [r.predicted_ttft_ms for r in rows], setting.slo_ttft_ms),
        (axes[3], "ITL", [r.observed_itl_ms for r in rows],
         [r.predicted_itl_ms for r in rows], setting.slo_itl_ms),
    ):  # fmt: skip
        ax.plot(t, series(obs), "o-", ms=3, label=f"measured {name}")
        ax.plot(t, series(pred), "s--", ms=3, label=f"predicted {name}")
        ax.axhline(target, color="red", linewidth=1, label=f"{name} target")
        ax.set(ylabel="ms", title=name)
    window_min = setting.cycle_s / 60
    spans = [
        (_spans([warming(r) for r in rows], t, window_min), "0.85", "warm-up: no parameters yet"),
        (_spans([missed(r, setting) for r in rows], t, window_min), "#f4b6b6",
         "cycle over a target"),
    ]  # fmt: skip
    for k, ax in enumerate(axes):
        for intervals, color, label in spans:
            for n, (start, end) in enumerate(intervals):
                shown = label if k == 0 and n == 0 else None  # one legend entry, top panel
                ax.axvspan(start, end, color=color, alpha=0.6, linewidth=0, label=shown)
        ax.legend(loc="upper left", fontsize=8)
        ax.grid(alpha=0.3)
    axes[3].set(xlabel="time (simulated minutes)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
