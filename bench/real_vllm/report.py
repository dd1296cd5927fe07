"""Fit (alpha, beta, gamma) to the real-vLLM sweep; held-out prediction, plot, report. Issue 9.

Reads `bench/results/real_vllm_sweep.json` (from `bench.real_vllm.sweep`). Each point's
observation is the collector's: arrival rate, token means, TTFT and token-weighted ITL from
vLLM's own histograms. Points whose backlog grew (saturated, tuner spec §8) are left out of every
fit. Three fits: all shapes (in-sample), and two held-out folds that each fit half the shapes in
a checkerboard over (input, output) and predict the other half with the queueing model. Then
the predicted against observed attainment at vLLM's bucket bounds (bench/real_vllm/attainment.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.lib.envelope import start_run, with_run
from bench.real_vllm import attainment
from bench.real_vllm.sweep import INPUT_LENGTHS, OUTPUT_LENGTHS, RESULTS_DIR, SWEEP_JSON
from model import FitResult, Observation, ServerConfig, ServiceParams, fit
from model.queueing.analyzer import analyze_points

FIT_JSON = RESULTS_DIR / "real_vllm_fit.json"
REPORT_MD = RESULTS_DIR / "real_vllm.md"
PLOT_PNG = RESULTS_DIR / "real_vllm_fit.png"
MAX_AVG_WAITING = 0.5  # requests (collector spec §8)
MAX_KV_USAGE_RATIO = 0.95  # collector spec §8


@dataclass(frozen=True, slots=True, kw_only=True)
class FoldResult:
    """One fit (on `train`) and the model's TTFT and ITL (ms) at every sweep point."""

    name: str
    fit: FitResult
    train: tuple[int, ...]
    test: tuple[int, ...]
    ttft_pred_ms: tuple[float, ...]
    itl_pred_ms: tuple[float, ...]


def saturated(observation: dict[str, Any]) -> bool:
    """Collector spec §8: any saturation sign the collector saw, or (for sweeps recorded before
    it reported them) a growing backlog, more than half a request waiting on average, or a KV
    cache over 95 % full."""
    return bool(
        observation.get("saturation")
        or observation["queue_growing"]
        or (observation["avg_waiting"] or 0.0) > MAX_AVG_WAITING
        or (observation["max_kv_cache_usage_ratio"] or 0.0) > MAX_KV_USAGE_RATIO
    )


def observations(points: list[dict[str, Any]], max_batch: int) -> list[Observation | None]:
    """The tuner's view of each point; None where the window has no latency.

    TTFT and ITL are the medians of the three sub-window means (issue 9: on two shared cores a
    single burst of Poisson arrivals can dominate one window), rate and tokens the whole window's.
    """
    out: list[Observation | None] = []
    for p in points:
        o = p["observation"]
        ttft = _sub_median(p, "ttft_ms")
        itl = _sub_median(p, "itl_ms")
        if ttft is None or itl is None or o["arrival_rate_rps"] <= 0:
            out.append(None)
            continue
        out.append(Observation(
            rate_rps=o["arrival_rate_rps"], avg_input_tokens=o["avg_input_tokens"],
            avg_output_tokens=o["avg_output_tokens"], ttft_ms=ttft, itl_ms=itl,
            max_batch_size=max_batch, queue_growing=saturated(o),
        ))
    return out


def _sub_median(point: dict[str, Any], key: str) -> float | None:
    values = [w[key] for w in point["sub_windows"] if w[key] is not None]
    if not values:
        return point["observation"][key]  # type: ignore[no-any-return]
    return float(np.median(values))


def predict(params: ServiceParams, server: ServerConfig,
            obs: list[Observation | None]) -> tuple[np.ndarray, np.ndarray]:
    """Model TTFT and ITL (ms) at every point's observed rate and shape; NaN where unobserved."""
    ttft = np.full(len(obs), np.nan)
    itl = np.full(len(obs), np.nan)
    idx = [i for i, o in enumerate(obs) if o is not None]
    if idx:
        chosen = [obs[i] for i in idx]
        analysis = analyze_points(
            params, server,
            np.array([o.avg_input_tokens for o in chosen if o is not None]),
            np.array([o.avg_output_tokens for o in chosen if o is not None]),
            np.array([o.rate_rps for o in chosen if o is not None]),
        )
        ttft[idx] = np.asarray(analysis.ttft_ms, dtype=float)
        itl[idx] = np.asarray(analysis.itl_ms, dtype=float)
    return ttft, itl


Shape = tuple[int, int]


def checkerboard(shapes: list[Shape]) -> tuple[set[Shape], set[Shape]]:
    """Half the (input, output) grid as in a checkerboard, and the other half."""
    first = {s for s in shapes
             if (INPUT_LENGTHS.index(s[0]) + OUTPUT_LENGTHS.index(s[1])) % 2 == 0}
    return first, set(shapes) - first


def run_fold(name: str, train: list[int], test: list[int], obs: list[Observation | None],
             server: ServerConfig) -> FoldResult:
    """Fit on the train points, predict every point."""
    result = fit([o for i in train if (o := obs[i]) is not None], server)
    ttft, itl = predict(result.params, server, obs)
    return FoldResult(name=name, fit=result, train=tuple(train), test=tuple(test),
                      ttft_pred_ms=tuple(float(v) for v in ttft),
                      itl_pred_ms=tuple(float(v) for v in itl))


def errors(
    fold: FoldResult, which: tuple[int, ...], obs: list[Observation | None]
) -> dict[str, Any]:
    """Mean and median |pred - meas| / meas of TTFT and ITL over the given points."""
    rows = [i for i in which if obs[i] is not None]
    out: dict[str, Any] = {"points": len(rows)}
    for metric, pred in (("ttft", fold.ttft_pred_ms), ("itl", fold.itl_pred_ms)):
        meas = np.array([getattr(obs[i], f"{metric}_ms") for i in rows])
        rel = np.abs(np.array([pred[i] for i in rows]) - meas) / meas
        finite = rel[np.isfinite(rel)]
        out[metric] = {
            "mean_abs_rel": float(finite.mean()) if finite.size else None,
            "median_abs_rel": float(np.median(finite)) if finite.size else None,
            "unstable_predictions": int(rel.size - finite.size),
        }
    return out


def plot(path: Path, folds: list[FoldResult], obs: list[Observation | None]) -> None:
    """Predicted vs measured TTFT and ITL: in-sample fit, and each point held out once."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    for ax, metric in zip(axes, ("ttft", "itl"), strict=True):
        for fold, marker, label in ((folds[0], "o", "in-sample (all shapes)"),
                                    (None, "x", "held out (other half's fit)")):
            xs, ys = [], []
            for i, o in enumerate(obs):
                if o is None or o.queue_growing:
                    continue
                source = fold or next(f for f in folds[1:] if i in f.test)
                xs.append(getattr(o, f"{metric}_ms"))
                ys.append((source.ttft_pred_ms if metric == "ttft" else source.itl_pred_ms)[i])
            ax.scatter(xs, ys, marker=marker, label=label)
        finite = [v for o in obs if o is not None for v in (getattr(o, f"{metric}_ms"),)]
        lo, hi = min(finite) / 1.5, max(finite) * 1.5
        ax.plot([lo, hi], [lo, hi], "k--", lw=1)
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi),
               xlabel=f"measured {metric.upper()} (ms, vLLM /metrics)",
               ylabel=f"predicted {metric.upper()} (ms)", title=metric.upper())
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(NullFormatter())
        ax.legend()
    fig.suptitle("Queueing model vs a real vLLM (CPU build, tiny Llama)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """CLI: fit, predict, write the plot, JSON and Markdown report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", type=Path, default=SWEEP_JSON)
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    run_start = start_run()
    sweep = json.loads(args.sweep.read_text())
    points: list[dict[str, Any]] = sweep["points"]
    options = sweep["meta"]["server"]
    server = ServerConfig(max_batch_size=options["max_num_seqs"],
                          max_num_batched_tokens=options["max_num_batched_tokens"])
    obs = observations(points, options["max_num_seqs"])
    usable = [i for i, o in enumerate(obs) if o is not None and not o.queue_growing]
    shape_of = [(p["shape"]["input_tokens"], p["shape"]["output_tokens"]) for p in points]
    half_a, half_b = checkerboard(sorted(set(shape_of)))
    in_a = [i for i in usable if shape_of[i] in half_a]
    in_b = [i for i in usable if shape_of[i] in half_b]
    folds = [run_fold("all shapes", usable, [], obs, server)]
    if in_a and in_b:
        folds += [run_fold("fit half A, predict half B", in_a, in_b, obs, server),
                  run_fold("fit half B, predict half A", in_b, in_a, obs, server)]
    summary = {
        "in_sample": errors(folds[0], tuple(usable), obs),
        "held_out": {f.name: errors(f, f.test, obs) for f in folds[1:]},
        "held_out_pooled": errors_pooled(folds[1:], obs) if len(folds) > 1 else None,
        "excluded_saturated": [i for i, o in enumerate(obs) if o is not None and o.queue_growing],
    }
    every, held = attainment.sweep_attainment(points, obs, server, folds[0].fit.params,
                                              [(f.fit.params, f.test) for f in folds[1:]])
    summary["attainment"] = {"in_sample": attainment.summarize(every),
                             "held_out": attainment.summarize(held) if held else None}
    document = {
        "sweep_meta": sweep["meta"],
        "fits": [{"name": f.name, "fit": f.fit.to_dict(), "train": f.train, "test": f.test,
                  "ttft_pred_ms": _json_floats(f.ttft_pred_ms),
                  "itl_pred_ms": _json_floats(f.itl_pred_ms)} for f in folds],
        "errors": summary,
        "attainment": [attainment.to_json(a) for a in every],
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(with_run(run_start, document), indent=2)
    (args.out_dir / FIT_JSON.name).write_text(text + "\n")
    plot(args.out_dir / PLOT_PNG.name, folds, obs)
    labels = [f"{s[0]}/{s[1]} at {p['rate_fraction']:.0%}" for s, p in zip(shape_of, points,
                                                                             strict=True)]
    report = [markdown(sweep, folds, obs, summary, shape_of),
              *attainment.markdown(every, summary["attainment"]["in_sample"],
                                   summary["attainment"]["held_out"], labels)]
    (args.out_dir / REPORT_MD.name).write_text("\n".join(report))
    print(f"alpha {folds[0].fit.params.alpha_ms:.3f} ms, beta {folds[0].fit.params.beta_ms:.3g} ms,"
          f" gamma {folds[0].fit.params.gamma_ms:.3g} ms; in-sample TTFT/ITL error "
          f"{_pct(summary['in_sample']['ttft']['mean_abs_rel'])}/"
          f"{_pct(summary['in_sample']['itl']['mean_abs_rel'])}")
    for point in every:
        print(attainment.point_line(point, labels[point.index]))
    for name, found in summary["attainment"]["in_sample"].items():
        print(f"{name.upper()} attainment at the bucket bounds: mean |pred - obs| "
              f"{attainment.points_text(found['mean_abs_gap_points'])} points over "
              f"{found['bounds']} bounds of {found['points']} points")
    print(f"wrote {args.out_dir / REPORT_MD.name}, {FIT_JSON.name}, {PLOT_PNG.name}")
    return 0


def errors_pooled(folds: list[FoldResult], obs: list[Observation | None]) -> dict[str, Any]:
    """Held-out errors with every point predicted by the fold that did not fit it."""
    out: dict[str, Any] = {"points": sum(1 for f in folds for i in f.test if obs[i] is not None)}
    for metric in ("ttft", "itl"):
        rel = []
        for fold in folds:
            pred = fold.ttft_pred_ms if metric == "ttft" else fold.itl_pred_ms
            for i in fold.test:
                o = obs[i]
                if o is not None:
                    meas = getattr(o, f"{metric}_ms")
                    rel.append(abs(pred[i] - meas) / meas)
        arr = np.array(rel)
        finite = arr[np.isfinite(arr)]
        out[metric] = {"mean_abs_rel": float(finite.mean()) if finite.size else None,
                       "median_abs_rel": float(np.median(finite)) if finite.size else None,
                       "unstable_predictions": int(arr.size - finite.size)}
    return out


def markdown(sweep: dict[str, Any], folds: list[FoldResult], obs: list[Observation | None],
             summary: dict[str, Any], shape_of: list[tuple[int, int]]) -> str:
    """The short human report."""
    meta = sweep["meta"]
    model, server = meta["model"], meta["server"]
    p = folds[0].fit.params
    lines = [
        "# vllm-sizer against a real vLLM (CPU build)",
        "",
        f"Generated by `make validate-vllm` (`bench/real_vllm/`). Engine: {meta['vllm']}, "
        f"{meta['cpus']} CPUs shared with other work; model: random-weight Llama, "
        f"{model['parameters'] / 1e6:.1f} M parameters (hidden {model['hidden_size']}, "
        f"{model['layers']} layers), float32; max_num_seqs {server['max_num_seqs']}, "
        f"max_num_batched_tokens {server['max_num_batched_tokens']}, prefix caching off.",
        "",
        f"- virtualenv install: {meta['venv_install_s']:.0f} s"
        f"{' (cached this run)' if meta['venv_cached'] else ''}; server startup: "
        f"{meta['server_startup_s']:.0f} s; sweep wall time: {meta['sweep_wall_s'] / 60:.1f} min.",
        "- Observations: our collector (`ScrapeSource` + `observe_deployment`) over vLLM's own "
        "/metrics; rate = the collector's arrival estimate, ITL = token-weighted "
        "`inter_token_latency_seconds`.",
        "",
        "## Fitted parameters (all shapes)",
        "",
        "| alpha (ms) | beta (ms/token) | gamma (ms/KV token) | status | identified (a, b, g) |",
        "|---|---|---|---|---|",
        f"| {p.alpha_ms:.3f} | {p.beta_ms:.3g} | {p.gamma_ms:.3g} | {folds[0].fit.status} | "
        f"{', '.join('yes' if f else 'no' for f in folds[0].fit.identified)} |",
        "",
        "## Errors: mean (median) of |pred - meas| / meas",
        "",
        "A point near the fitted saturation rate can be off by a large factor in TTFT; the "
        "median shows the typical point.",
        "",
        "| set | points | TTFT | ITL |",
        "|---|---|---|---|",
        _error_row("in-sample", summary["in_sample"]),
    ]
    for name, err in summary["held_out"].items():
        lines.append(_error_row(f"held out: {name}", err))
    if summary["held_out_pooled"]:
        pooled = summary["held_out_pooled"]
        lines.append(f"| held out, pooled | {pooled['points']} | {_pair(pooled['ttft'])} | "
                     f"{_pair(pooled['itl'])} |")
    lines.append("")
    for f in folds[1:]:
        q = f.fit.params
        lines.append(f"- {f.name}: alpha {q.alpha_ms:.3f}, beta {q.beta_ms:.3g}, "
                     f"gamma {q.gamma_ms:.3g} ({f.fit.status})")
    lines += ["", "## Shapes", "",
              "Single requests (median of 3; server histograms, and the client's TTFT with the "
              "HTTP round trip) and a burst of 80 requests (saturation from its completions).",
              "", "| input | output | single TTFT (ms) | client TTFT (ms) | single TPOT (ms) | "
              "burst saturation (req/s) | burst ITL (ms) |", "|---|---|---|---|---|---|---|"]
    for probe in sweep["probes"]:
        s = probe["shape"]
        lines.append(f"| {s['input_tokens']} | {s['output_tokens']} | "
                     f"{_num(probe['single_ttft_ms'], 1)} | "
                     f"{_num(probe.get('single_client_ttft_ms'), 1)} | "
                     f"{_num(probe['single_tpot_ms'], 2)} | {probe['saturation_rps']:.2f} | "
                     f"{_num(probe.get('burst_itl_ms'), 2)} |")
    lines += ["", "## Points", "",
              "Measured TTFT and ITL: median of three sub-window means from vLLM's histograms; "
              "predicted: the all-shapes fit at the collector's arrival rate.", "",
              "| input | output | load | rate (req/s) | running | TTFT meas / pred (ms) | "
              "ITL meas / pred (ms) | waiting | note |", "|---|---|---|---|---|---|---|---|---|"]
    for i, point in enumerate(sweep["points"]):
        o = point["observation"]
        note = "saturated, not fitted" if saturated(o) else ""
        lines.append(
            f"| {shape_of[i][0]} | {shape_of[i][1]} | {point['rate_fraction']:.0%} | "
            f"{o['arrival_rate_rps']:.2f} | {_num(o['avg_running'], 1)} | "
            f"{_num(_sub_median(point, 'ttft_ms'), 1)} / {_num(folds[0].ttft_pred_ms[i], 1)} | "
            f"{_num(_sub_median(point, 'itl_ms'), 2)} / {_num(folds[0].itl_pred_ms[i], 2)} | "
            f"{_num(o['avg_waiting'], 2)} | {note} |")
    excluded = len(summary["excluded_saturated"])
    lines += [
        "", "## What limits these numbers", "",
        "- Two CPU cores, shared: vLLM binds its engine to one core and leaves the other to its "
        "API server, our load generator and whatever else runs on the machine, so latencies "
        "repeat only within about 25 % between runs.",
        "- The client's TTFT is the server's plus the HTTP and tokenizer path (about 10-20 ms "
        "here); the fit uses the server's histograms, as the daemon does.",
        "- The burst saturation overstates what the engine sustains under Poisson arrivals, so the "
        "heaviest points sit close to a full batch; saturated points (backlog grew, more than "
        f"0.5 requests waiting on average, or KV cache > 95 %: {excluded} here) are left out of "
        "the fits (tuner spec §8).",
        "- With a 10 M-parameter model the per-iteration cost alpha dominates at light load; "
        "gamma shows mostly in the long-context, high-occupancy points.",
        "", f"![predicted vs measured]({PLOT_PNG.name})", "",
    ]
    return "\n".join(lines)


def _error_row(name: str, err: dict[str, Any]) -> str:
    return f"| {name} | {err['points']} | {_pair(err['ttft'])} | {_pair(err['itl'])} |"


def _pair(err: dict[str, Any]) -> str:
    return f"{_pct(err['mean_abs_rel'])} ({_pct(err['median_abs_rel'])})"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _num(value: float | None, digits: int) -> str:
    return "n/a" if value is None or not np.isfinite(value) else f"{value:.{digits}f}"


def _json_floats(values: tuple[float, ...]) -> list[float | None]:
    return [v if np.isfinite(v) else None for v in values]


if __name__ == "__main__":
    sys.exit(main())
