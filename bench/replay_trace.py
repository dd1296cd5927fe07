"""`vllm-sizer replay` on a one-hour, 50k-request trace with four policies: wall time and peak
memory of the command (issue 20: under 2 minutes and 500 MB on 2 cores).

The trace is generated: a diurnal-like day compressed into an hour (the rate follows
1 - 0.6 cos(2 pi t / 1 h) around its mean, 0.4x at the ends to 1.6x at the half hour, piecewise
linear every 5 minutes), Poisson arrivals, lognormal lengths with a real-traffic spread (prompts
mean 1024 tokens CV 1.5, outputs mean 256 CV 1.2, each capped at 16384), written in the Azure
trace's format (TIMESTAMP with seven fractional digits, ContextTokens, GeneratedTokens). The
serving truth is paper Table I (Llama-3.1-8B, H100); targets: mean TTFT 200 ms, mean ITL 30 ms,
p95 TTFT 1 s; 1-12 replicas, new ones ready after 90 s. The command runs as a child process, its
policies in that one process (`--jobs 1`: the kernel's peak RSS is then the whole command's;
bench/replay_scale.py measures the parallel processes); its peak RSS and CPU time are the
kernel's (RUSAGE_CHILDREN): on a machine other work loads, the CPU time is what the command
would take alone on one core.

Writes bench/results/replay_trace.json (timing, memory, the report's per-policy figures) and
bench/results/replay_trace.png. Run: .venv/bin/python bench/replay_trace.py [--requests N]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.lib.envelope import start_run, with_run  # noqa: E402
from model.simulation.workloads import (  # noqa: E402
    LengthDist,
    LengthKind,
    RateProfile,
    RateSegment,
    draw_trace,
)

RESULTS = REPO_ROOT / "bench" / "results"
HOUR_S = 3600.0
STEPS = 12  # rate points over the span: every 5 minutes of the hour
SEED = 20
MAX_TOKENS = 16_384
TIME_LIMIT_S = 120.0
MEMORY_LIMIT_MB = 500.0
POLICIES = "ours,throughput,reactive,fixed"


def rate_points(mean_rps: float, span_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(time s, rate req/s) every span_s / 12 over span_s, averaging mean_rps."""
    step_s = span_s / STEPS
    t = np.linspace(0.0, span_s, STEPS + 1)
    shape = 1.0 - 0.6 * np.cos(2 * math.pi * t / span_s)
    # The trapezoids' mean of the shape is not exactly 1: normalise on it.
    mean_shape = float(np.sum((shape[1:] + shape[:-1]) / 2) * step_s / span_s)
    return t, shape * mean_rps / mean_shape


def lognormal(rng: np.random.Generator, mean: float, cv: float, size: int) -> np.ndarray:
    sigma2 = math.log1p(cv * cv)
    draws = rng.lognormal(math.log(mean) - sigma2 / 2, math.sqrt(sigma2), size)
    return np.clip(np.rint(draws), 1, MAX_TOKENS).astype(np.int64)


def write_trace(path: Path, requests: int, seed: int, span_s: float = HOUR_S) -> int:
    """Write a trace of about `requests` over span_s; the number of rows."""
    rng = np.random.default_rng(seed)
    t, rate = rate_points(requests / span_s, span_s)
    profile = RateProfile(tuple(RateSegment(span_s / STEPS, float(rate[k]), float(rate[k + 1]))
                                for k in range(t.size - 1)))
    fixed = LengthDist(LengthKind.FIXED, 1)
    arrivals = draw_trace(profile, fixed, fixed, rng, duration_s=span_s).arrival_s
    prompts = lognormal(rng, 1024, 1.5, arrivals.size)
    outputs = lognormal(rng, 256, 1.2, arrivals.size)
    start = datetime(2024, 5, 10, 8, 0, tzinfo=UTC)
    with path.open("w") as fh:
        fh.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for at, n_in, n_out in zip(arrivals.tolist(), prompts.tolist(), outputs.tolist(),
                                   strict=True):
            stamp = start + timedelta(seconds=at)
            micro = stamp.strftime("%Y-%m-%d %H:%M:%S.%f")
            fh.write(f"{micro}{int(at * 1e7) % 10},{n_in},{n_out}\n")
    return int(arrivals.size)


CONFIG = {
    "cycle_period_s": 30,
    "deployments": [{
        "name": "llama-8b-vllm",
        "model_name": "meta-llama/Llama-3.1-8B-Instruct",
        "source": {"scrape_urls": ["http://vllm:8000/metrics"]},
        "server": {"max_num_seqs": 256, "max_num_batched_tokens": 8192},
        "slo": {"ttft_ms": 200, "itl_ms": 30, "ttft": {"p95_ms": 1000}},
        "replicas": {"min": 1, "max": 12},
        "look_ahead_s": 90,
    }],
    "replay": {
        "truth": {"alpha_ms": 6.68, "beta_ms": 0.0201, "gamma_ms": 5.52e-05},
        "startup_delay_s": 90,
        "initial_replicas": 2,
        "fixed_replicas": 6,
        "reactive": {"metric": "waiting", "threshold": 5},
    },
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    run_start = start_run()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        trace = work / "trace.csv"
        began = time.perf_counter()
        rows = write_trace(trace, args.requests, args.seed)
        print(f"trace: {rows} requests over 1 h ({trace.stat().st_size / 1e6:.1f} MB), "
              f"written in {time.perf_counter() - began:.1f} s", flush=True)
        config = work / "config.yaml"
        config.write_text(yaml.safe_dump(CONFIG))
        out = work / "out"
        # Names relative to the work folder: the report echoes them, and the JSON is committed.
        command = [sys.executable, "-m", "exporter.cli.main", "replay", "--trace", trace.name,
                   "--config", config.name, "--policy", POLICIES, "--out", out.name,
                   "--seed", str(args.seed), "--price-per-replica-hour", "2.5",
                   "--no-fixed-best",  # the command's own cost, not the fixed-fleet search's
                   "--jobs", "1"]
        load = os.getloadavg()
        began = time.perf_counter()
        done = subprocess.run(command, cwd=work, capture_output=True, text=True, check=False,
                              env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
        wall = time.perf_counter() - began
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        peak_mb, cpu_s = usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime
        print(done.stdout)
        if done.returncode != 0:
            print(done.stderr, file=sys.stderr)
            raise SystemExit(f"replay failed with status {done.returncode}")
        report = json.loads((out / "replay.json").read_text())
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "replay_trace.png").write_bytes((out / "replay.png").read_bytes())
    ok_time, ok_memory = wall < TIME_LIMIT_S, peak_mb < MEMORY_LIMIT_MB
    print(f"wall {wall:.1f} s (limit {TIME_LIMIT_S:.0f}: {'ok' if ok_time else 'OVER'}), "
          f"CPU {cpu_s:.1f} s, peak RSS {peak_mb:.0f} MB (limit {MEMORY_LIMIT_MB:.0f}: "
          f"{'ok' if ok_memory else 'OVER'}), load average {load[0]:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after")
    summary = {
        "requests": rows,
        "policies": POLICIES.split(","),
        "wall_s": wall,
        "cpu_s": cpu_s,
        "peak_rss_mb": peak_mb,
        "load_average_before": load[0],
        "load_average_after": os.getloadavg()[0],
        "cpu_count": os.cpu_count(),
        "within_limits": ok_time and ok_memory,
        "config": CONFIG,
        "report": {k: v for k, v in report.items() if k != "series"},
        # The table without the line naming the temporary output files.
        "table": "".join(line for line in done.stdout.splitlines(keepends=True)
                         if not line.startswith("wrote ")),  # fmt: skip
    }
    path = RESULTS / "replay_trace.json"
    path.write_text(json.dumps(with_run(run_start, summary), indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
