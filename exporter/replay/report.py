"""The replay's report: a terminal table and a PNG (load, replicas per policy, latency per policy
against the targets), both from the JSON of `session.result_json`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


def json_safe(value: Any) -> Any:
    """`value` with every NaN or infinity replaced by None (JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def _share(entry: dict[str, Any]) -> str:
    share = entry["met_share"]
    if share is None:
        return "-"
    return f"{100 * share:.1f}% ({entry['met']}/{entry['judged']})"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def table(report: dict[str, Any]) -> str:
    """The report as aligned text, one column per policy."""
    policies: dict[str, Any] = report["policies"]
    names = list(policies)
    first = policies[names[0]] if names else {"targets": {}}
    rows: list[tuple[str, list[str]]] = [
        ("replica-hours", [f"{p['replica_hours']:.2f}" for p in policies.values()]),
    ]
    if report.get("price_per_replica_hour") is not None:
        rows.append(("cost", [f"{p['cost']:.2f}" for p in policies.values()]))
    rows += [
        ("mean replicas", [_ms(p["mean_replicas"]) for p in policies.values()]),
        ("peak replicas", [str(p["peak_replicas"]) for p in policies.values()]),
    ]
    for key, entry in first["targets"].items():
        label = f"{key} <= {entry['target_ms']:g} ms"
        rows.append((f"windows meeting {label}",
                     [_share(p["targets"][key]) for p in policies.values()]))
        rows.append(("  worst window (ms)",
                     [_worst(p["targets"][key]) for p in policies.values()]))
    rows += [
        ("windows meeting every target", [_share(p["all_targets"]) for p in policies.values()]),
        ("cost / fixed best", [_ratio(p.get("cost_ratio_vs_fixed_best"))
                               for p in policies.values()]),
        ("windows in hand-over", [_percent(p.get("handover_share")) for p in policies.values()]),
        ("reversals of the count", [str(p.get("reversals", "-")) for p in policies.values()]),
        ("replica-hours not yet serving", [f"{p.get('unready_replica_hours', 0.0):.2f}"
                                           for p in policies.values()]),
        ("peak queue (requests)", [str(p["peak_queue"]) for p in policies.values()]),
        ("requests refused", [str(p["rejected_requests"]) for p in policies.values()]),
    ]
    width = max(len(label) for label, _ in rows) + 2
    col = max(14, *(len(c) + 2 for _, cells in rows for c in cells), *(len(n) + 2 for n in names))
    lines = [*header(report), f"{'':{width}}" + "".join(f"{n:>{col}}" for n in names)]
    lines += [f"{label:{width}}" + "".join(f"{c:>{col}}" for c in cells) for label, cells in rows]
    return "\n".join(lines)


def header(report: dict[str, Any]) -> list[str]:
    """What was replayed, how it was judged, and the fixed fleet every policy is priced
    against."""
    lines = [
        f"{'partial ' if report['partial'] else ''}replay: {report['windows']} windows of "
        f"{report['window_s']:g} s ({report['duration_s'] / 3600:.2f} h), "
        f"{report['arrivals']} requests, {report['wall_s']:.1f} s"
    ]
    given = report.get("input")
    if given is not None:
        source = given["trace"] or given["rate_profile"]
        rows = "" if given["rows_read"] is None else f", {given['rows_read']} rows read"
        lines.append(f"input: {source}{rows}; rate x{given['rate_scale']:g} "
                     f"({given['scale_mode']}), speed x{given['speed']:g}, spread "
                     f"{given['spread_s']:g} s; prefix reuse {given['prefix_reuse']}")
    if report.get("mean_input_tokens") is not None:
        lines.append(f"mean lengths: prompt {report['mean_input_tokens']:.0f}, output "
                     f"{report['mean_output_tokens']:.0f} tokens")
    if "judged_from_s" in report:
        r = report["replicas"]
        lines.append(f"judged: {report['judged_windows']} windows from {report['judged_from_s']:g} "
                     f"s (after the first startup delay); every policy starts at {r['initial']} "
                     f"replica{'' if r['initial'] == 1 else 's'}")
    if "fixed_best_n" in report:
        best = report["fixed_best_n"]
        lines.append(
            f"cheapest fixed fleet meeting every target in >= {100 * report['min_met_share']:g} % "
            f"of judged windows: {best} replicas" if best is not None else
            f"infeasible: no fixed fleet up to {report['max_replicas']} replicas meets every "
            f"target in {100 * report['min_met_share']:g} % of judged windows (not scored)"
        )
    return lines


def title(report: dict[str, Any]) -> str:
    """The PNG's title: trace, scale and targets."""
    given = report.get("input") or {}
    source = Path(given.get("trace") or given.get("rate_profile") or "replay").name
    scale = f"x{given.get('rate_scale', 1.0):g} ({given.get('scale_mode', 'copies')})"
    names = list(report["policies"])
    targets = [] if not names else [
        f"{key} <= {entry['target_ms']:g} ms"
        for key, entry in report["policies"][names[0]]["targets"].items()
    ]
    return (f"{'partial ' if report['partial'] else ''}replay of {source}, rate {scale}\n"
            f"targets: {', '.join(targets)}")


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _worst(entry: dict[str, Any]) -> str:
    if entry["worst_ms"] is None:
        return "-"
    return f"{entry['worst_ms']:.4g} at {entry['worst_end_s'] / 60:.1f} min"


def plot(report: dict[str, Any], path: Path) -> None:
    """Load; per policy (one panel each, so none hides another) the replicas asked for and
    ready; each target's value per policy against it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from exporter.base.plot_axes import plain_log_ticks

    series: dict[str, Any] = report["series"]
    names = [n for n in report["policies"] if n in series]
    keys = list(report["policies"][names[0]]["targets"]) if names else []
    panels = 1 + len(names) + len(keys)
    fig, axes = plt.subplots(panels, 1, figsize=(10, 2.0 * panels + 1.0), sharex=True,
                             squeeze=False)
    ax = axes[:, 0]
    window_s = report["window_s"]
    # Each row's end (an idle stretch skipped whole is one row, at its end).
    t_min = ([end_s / 60 for end_s in series[names[0]]["end_s"]] if names
             else [(k + 1) * window_s / 60 for k in range(len(series["offered_rps"]))])
    ax[0].plot(t_min, series["offered_rps"], "k-", lw=0.9)
    ax[0].set_ylabel("offered load\n(req/s)")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    top = max((max(series[n]["provisioned"], default=0) for n in names), default=1)
    for k, name in enumerate(names):
        a = ax[1 + k]
        a.step(t_min, series[name]["provisioned"], where="pre", color=colors[k % len(colors)],
               label="asked for")
        a.step(t_min, series[name]["ready"], where="pre", color="k", lw=0.8, ls="--",
               label="ready")
        a.set_ylim(0, top + 1)
        a.set_ylabel(f"{name}\nreplicas")
        a.legend(fontsize=7, loc="upper left")
    for k, key in enumerate(keys):
        a = ax[1 + len(names) + k]
        target = report["policies"][names[0]]["targets"][key]["target_ms"]
        for j, name in enumerate(names):
            values = [float("nan") if v is None else v for v in series[name][key]]
            a.plot(t_min, values, ".-", lw=0.8, ms=2, color=colors[j % len(colors)], label=name)
        a.axhline(target, color="k", ls="--", lw=0.8, label="target")
        a.set_yscale("log")
        plain_log_ticks(a)
        a.set_ylabel(f"{key} (ms)")
        a.legend(fontsize=7, loc="upper left")
    if "judged_from_s" in report:
        for a in ax:
            a.axvspan(0, report["judged_from_s"] / 60, color="0.9", lw=0)
    ax[-1].set_xlabel("time (min); shaded: not judged (first startup delay)")
    for a in ax:
        a.grid(alpha=0.3)
    fig.suptitle(title(report), fontsize=10)
    fig.tight_layout(rect=(0.0, 0.0, 1.0, 0.97))
    fig.savefig(path, dpi=80)
    plt.close(fig)
