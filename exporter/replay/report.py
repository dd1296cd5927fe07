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
        ("peak queue (requests)", [str(p["peak_queue"]) for p in policies.values()]),
        ("requests refused", [str(p["rejected_requests"]) for p in policies.values()]),
    ]
    head = (
        f"{'partial ' if report['partial'] else ''}replay: {report['windows']} windows of "
        f"{report['window_s']:g} s ({report['duration_s'] / 3600:.2f} h), "
        f"{report['arrivals']} requests, {report['wall_s']:.1f} s"
    )
    width = max(len(label) for label, _ in rows) + 2
    col = max(14, *(len(c) + 2 for _, cells in rows for c in cells), *(len(n) + 2 for n in names))
    lines = [head, f"{'':{width}}" + "".join(f"{n:>{col}}" for n in names)]
    lines += [f"{label:{width}}" + "".join(f"{c:>{col}}" for c in cells) for label, cells in rows]
    return "\n".join(lines)


def _worst(entry: dict[str, Any]) -> str:
    if entry["worst_ms"] is None:
        return "-"
    return f"{entry['worst_ms']:.4g} at {entry['worst_end_s'] / 60:.1f} min"


def plot(report: dict[str, Any], path: Path) -> None:
    """Load, replicas per policy, and each target's value per policy against it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from exporter.base.plot_axes import plain_log_ticks

    series: dict[str, Any] = report["series"]
    names = list(report["policies"])
    keys = list(report["policies"][names[0]]["targets"]) if names else []
    fig, axes = plt.subplots(2 + len(keys), 1, figsize=(10, 3 + 2.4 * (1 + len(keys))),
                             sharex=True, squeeze=False)
    ax = axes[:, 0]
    window_s = report["window_s"]
    t_min = [(k + 1) * window_s / 60 for k in range(len(series["offered_rps"]))]
    ax[0].plot(t_min, series["offered_rps"], "k-", lw=0.9)
    ax[0].set_ylabel("offered load (req/s)")
    for name in names:
        ax[1].step(t_min, series[name]["provisioned"], where="pre", label=name)
    ax[1].set_ylabel("replicas asked for")
    for k, key in enumerate(keys):
        target = report["policies"][names[0]]["targets"][key]["target_ms"]
        for name in names:
            values = [float("nan") if v is None else v for v in series[name][key]]
            ax[2 + k].plot(t_min, values, ".-", lw=0.8, ms=2, label=name)
        ax[2 + k].axhline(target, color="k", ls="--", lw=0.8, label="target")
        ax[2 + k].set_yscale("log")
        plain_log_ticks(ax[2 + k])
        ax[2 + k].set_ylabel(f"{key} (ms)")
    ax[-1].set_xlabel("time (min)")
    for a in ax:
        a.grid(alpha=0.3)
    for a in ax[1:]:
        a.legend(fontsize=7, loc="upper left")
    fig.suptitle(("partial " if report["partial"] else "") + "replay")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
