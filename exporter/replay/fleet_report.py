"""The fleet replay's PNG, drawn from the JSON of `fleet_run.fleet_json`: per policy (one panel
each) the replicas asked for, stacked by variant; the cost per hour of every policy; each
model's TTFT and ITL per policy against its targets. The style is the single-deployment
replay's (exporter/replay/report.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_fleet(report: dict[str, Any], path: Path, title: str = "fleet replay") -> None:
    """Write the PNG of `report` (a `fleet_json` dict) to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from exporter.base.plot_axes import plain_log_ticks

    series: dict[str, Any] = report["series"]
    names = [n for n in report["policies"] if n in series]
    variants: list[str] = list(report["variants"])
    targets: dict[str, dict[str, float]] = report["targets"]
    keys = [(model, key) for model in targets for key in ("ttft_ms", "itl_ms")]
    panels = len(names) + 1 + len(keys)
    fig, axes = plt.subplots(panels, 1, figsize=(10, 1.8 * panels + 1.0), sharex=True,
                             squeeze=False)
    ax = axes[:, 0]
    window_s = report["window_s"]
    t_min = [(k + 1) * window_s / 60 for k in range(report["windows"])]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    top = max((sum(max(series[n][v]) for v in variants) for n in names), default=1)
    for k, name in enumerate(names):
        a = ax[k]
        below = [0.0] * len(t_min)
        for j, v in enumerate(variants):
            above = [b + c for b, c in zip(below, series[name][v], strict=True)]
            a.fill_between(t_min, below, above, step="pre", color=colors[j % len(colors)],
                           lw=0, label=v)
            below = above
        a.set_ylim(0, top + 1)
        a.set_ylabel(f"{name}\nreplicas")
        a.legend(fontsize=7, loc="upper left", ncol=len(variants))
    a = ax[len(names)]
    for k, name in enumerate(names):
        a.step(t_min, series[name]["cost_per_hour"], where="pre", lw=0.9,
               color=colors[k % len(colors)], label=name)
    a.set_ylabel("cost per hour")
    a.legend(fontsize=7, loc="upper left", ncol=len(names))
    for i, (model, key) in enumerate(keys):
        a = ax[len(names) + 1 + i]
        for k, name in enumerate(names):
            values = [float("nan") if v is None else v for v in series[name][f"{model}:{key}"]]
            a.plot(t_min, values, ".-", lw=0.8, ms=2, color=colors[k % len(colors)], label=name)
        a.axhline(targets[model][key], color="k", ls="--", lw=0.8, label="target")
        a.set_yscale("log")
        plain_log_ticks(a)
        a.set_ylabel(f"{model}\n{key.replace('_ms', '')} (ms)")
        a.legend(fontsize=7, loc="upper left", ncol=len(names) + 1)
    for a in ax:
        a.axvspan(0, report["judged_from_s"] / 60, color="0.9", lw=0, zorder=0)
        a.grid(alpha=0.3)
    ax[-1].set_xlabel("time (min); shaded: not judged (first startup delay)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0.0, 0.0, 1.0, 0.97))
    fig.savefig(path, dpi=70)
    plt.close(fig)
