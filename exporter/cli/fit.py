"""`vllm-sizer fit`: the alpha, beta, gamma that a CSV of measured operating points implies."""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from exporter.cli.fleet_options import add_server_limits, input_file, output_file
from model import Observation, ServerConfig, ServiceParams, fit
from model.queueing.analyzer import analyze_points

CSV_ALIASES = {
    "rate_rps": ("rate_rps",),
    "avg_input_tokens": ("avg_input_tokens", "avg_in_tokens", "in_tokens"),
    "avg_output_tokens": ("avg_output_tokens", "avg_out_tokens", "out_tokens"),
    "ttft_ms": ("ttft_ms",),
    "itl_ms": ("itl_ms",),
}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `fit` subcommand."""
    fit_cmd = sub.add_parser(
        "fit",
        help="fit alpha, beta, gamma to a CSV of measured points",
        description="Fit alpha, beta, gamma to measured operating points (one CSV row each: the "
        "rate per replica, mean request lengths and mean TTFT and ITL); print them, their "
        "errors and which of them the points identify.",
    )
    fit_cmd.add_argument(
        "--csv",
        type=input_file,
        required=True,
        help="columns rate_rps (per replica), avg_input_tokens, "
        "avg_output_tokens, ttft_ms, itl_ms (avg_in_tokens/avg_out_tokens too)",
    )
    add_server_limits(fit_cmd)  # of the measured server
    fit_cmd.add_argument(
        "--png", type=output_file, help="write a predicted-vs-measured plot (PNG) here"
    )
    fit_cmd.set_defaults(func=run_fit)


def read_observations(
    path: Path, keep: Callable[[Mapping[str, str]], bool] | None = None
) -> list[Observation]:
    """Observations from a CSV (see `fit --help` for the columns), of the rows `keep` accepts;
    ValueError names the row."""
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        columns = {}
        for name, aliases in CSV_ALIASES.items():
            found = next((a for a in aliases if a in (reader.fieldnames or [])), None)
            if found is None:
                raise ValueError(f"{path}: missing column {name!r} (or one of {aliases})")
            columns[name] = found
        points = []
        for line, row in enumerate(reader, start=2):
            if keep is not None and not keep(row):
                continue
            try:
                values = {k: float(row[c]) for k, c in columns.items()}
                points.append(
                    Observation(
                        rate_rps=values["rate_rps"],
                        avg_input_tokens=values["avg_input_tokens"],
                        avg_output_tokens=values["avg_output_tokens"],
                        ttft_ms=values["ttft_ms"],
                        itl_ms=values["itl_ms"],
                    )
                )
            except ValueError as exc:
                raise ValueError(f"{path}:{line}: {exc}") from exc
    if not points:
        raise ValueError(f"{path}: no data rows")
    return points


def run_fit(args: argparse.Namespace) -> int:
    try:
        points = read_observations(args.csv)
        server = ServerConfig(args.max_num_seqs, args.max_num_batched_tokens)
    except (OSError, ValueError) as exc:
        print(f"vllm-sizer fit: {exc}", file=sys.stderr)
        return 2
    result = fit(points, server)
    p = result.params
    print(f"{len(points)} points; {result.status}: {result.message}")
    print(f"alpha = {p.alpha_ms:.4g} ms   beta = {p.beta_ms:.4g} ms   gamma = {p.gamma_ms:.4g} ms")
    print(
        f"ITL error {100 * result.itl_error.mean_ratio:.1f}% (median "
        f"{100 * result.itl_error.median_ratio:.1f}%), TTFT error "
        f"{100 * result.ttft_error.mean_ratio:.1f}% (median "
        f"{100 * result.ttft_error.median_ratio:.1f}%); {result.nfev} model evaluations"
    )
    weak = [
        n for n, ok in zip(("alpha", "beta", "gamma"), result.identified, strict=True) if not ok
    ]
    if weak:
        print(f"not identified by these points: {', '.join(weak)} (vary request shapes and load)")
    if args.png:
        _plot_fit(args.png, points, server, p)
        print(f"wrote {args.png}")
    return 0 if result.success else 1


def _plot_fit(
    path: Path, points: list[Observation], server: ServerConfig, params: ServiceParams
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from exporter.base.plot_axes import plain_log_ticks

    pred = analyze_points(
        params,
        server,
        [o.avg_input_tokens for o in points],
        [o.avg_output_tokens for o in points],
        [o.rate_rps for o in points],
    )
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    for ax, name, measured, predicted in (
        (axes[0], "TTFT", [o.ttft_ms for o in points], pred.ttft_ms),
        (axes[1], "ITL", [o.itl_ms for o in points], pred.itl_ms),
    ):
        ax.loglog(measured, predicted, "o", markersize=4)
        lo = min(min(measured), float(np.min(predicted)))
        hi = max(max(measured), float(np.max(predicted)))
        ax.plot([lo, hi], [lo, hi], "k--", linewidth=1, label="y = x")
        ax.set(xlabel=f"measured {name} (ms)", ylabel=f"predicted {name} (ms)", title=name)
        plain_log_ticks(ax)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
