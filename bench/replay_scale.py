"""`vllm-sizer replay` at the scale of a day (issue 45): a generated 24 h, 1M-request trace, four
policies, against 120 s wall and 1 GB peak memory on a 2-core machine; before that, on a slice
(1 h, 50k requests), the engine before issue 45 and the current one side by side in this
process, with their reports compared figure by figure.

The traces are bench/replay_trace.py's generator over the span: the rate follows
1 - 0.6 cos(2 pi t / span) around its mean (0.4x at the ends to 1.6x at mid-span, piecewise
linear over 12 steps), Poisson arrivals, lognormal lengths (prompts mean 1024 tokens CV 1.5,
outputs mean 256 CV 1.2, capped at 16384), in the Azure trace's format; config, truth (paper
Table I Llama-3.1-8B on H100) and policies as that bench's.

Slice (in this process): the reference engine (`replay(..., reference=True)`: the simulator's
numpy replica step, every pod read through the exposition text, one process), then the current
engine in this process and with the policies in `--jobs` processes; CPU time is this process's
plus its children's (time.process_time and RUSAGE_CHILDREN), so it stays meaningful on a
loaded machine. Day (the command as a child process, `--jobs`): wall time, CPU time, and peak
memory as the sum of the resident sets of the command and its processes (read from /proc every
0.2 s; RUSAGE_CHILDREN's is one process's).

Writes bench/results/replay_scale.json. Run: .venv/bin/python bench/replay_scale.py
[--requests N] [--hours H] [--slice-requests N] [--jobs N] [--no-slice] [--no-day]
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
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.lib.envelope import start_run, with_run  # noqa: E402
from bench.replay_trace import CONFIG, POLICIES, SEED, write_trace  # noqa: E402
from exporter.replay.parallel import replay_parallel  # noqa: E402
from exporter.replay.policies import PolicyName  # noqa: E402
from exporter.replay.session import replay, result_json  # noqa: E402
from exporter.replay.settings import load_settings  # noqa: E402
from exporter.replay.trace import TraceReader  # noqa: E402
from model.calibration.warmup import compile_model_kernel  # noqa: E402

RESULTS = REPO_ROOT / "bench" / "results"
TIME_LIMIT_S = 120.0
MEMORY_LIMIT_MB = 1024.0
TOLERANCE = 1e-9


def _cpu_s() -> float:
    """CPU time of this process and of its children waited for (s)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def largest_difference(a: Any, b: Any) -> float:
    """The largest relative difference between two JSON values (inf where they differ in
    shape or in a value that is not a number)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return math.inf
        return max((largest_difference(a[k], b[k]) for k in a), default=0.0)
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return math.inf
        return max((largest_difference(x, y) for x, y in zip(a, b, strict=True)), default=0.0)
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool):
        if a == b:
            return 0.0
        return abs(a - b) / max(abs(a), abs(b), 1.0)
    return 0.0 if a == b else math.inf


def _report(result: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(result_json(result, 2.5)))
    out.pop("wall_s")
    return dict(out)


def run_slice(work: Path, requests: int, seed: int, jobs: int) -> dict[str, Any]:
    """The reference engine and the current one on a one-hour slice, in this process."""
    trace = work / "slice.csv"
    rows = write_trace(trace, requests, seed)
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    settings = load_settings(config)
    truth = settings.truth
    assert truth is not None
    policies = tuple(PolicyName(p) for p in POLICIES.split(","))

    def source() -> TraceReader:
        return TraceReader(trace, rng=np.random.default_rng(seed))

    runs: dict[str, dict[str, Any]] = {}
    reports: dict[str, dict[str, Any]] = {}
    for name, how in (("reference", None), ("current, 1 process", 1),
                      (f"current, {jobs} processes", jobs)):
        load = os.getloadavg()[0]
        cpu, wall = _cpu_s(), time.perf_counter()
        if how is None:
            with source() as reader:
                result = replay(settings, truth, policies, reader, reference=True)
        else:
            result = replay_parallel(settings, truth, policies, source, jobs=how)
        runs[name] = {"cpu_s": _cpu_s() - cpu, "wall_s": time.perf_counter() - wall,
                      "load_average_before": load, "load_average_after": os.getloadavg()[0]}
        reports[name] = _report(result)
        print(f"slice, {name}: {runs[name]['cpu_s']:.1f} s CPU, {runs[name]['wall_s']:.1f} s "
              f"wall (load {load:.1f}-{runs[name]['load_average_after']:.1f})", flush=True)
    base = reports["reference"]
    for name in list(runs)[1:]:
        runs[name]["largest_difference_vs_reference"] = largest_difference(base, reports[name])
        runs[name]["cpu_speedup"] = runs["reference"]["cpu_s"] / runs[name]["cpu_s"]
        print(f"  {name}: {runs[name]['cpu_speedup']:.2f}x less CPU than the reference, "
              f"largest relative difference of the report "
              f"{runs[name]['largest_difference_vs_reference']:.1e}")
    return {"requests": rows, "hours": 1.0, "runs": runs,
            "equal_within_1e-9": all(r.get("largest_difference_vs_reference", 0.0) <= TOLERANCE
                                     for r in runs.values()),
            "policies": {name: {k: base["policies"][name][k]
                                for k in ("mean_replicas", "met_share", "rejected_requests")}
                         for name in base["policies"]}}


def _tree_rss_mb(root: int) -> float:
    """Resident memory of `root` and its descendants (MB), from /proc."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            parents[int(entry.name)] = int(fields[1])
            rss[int(entry.name)] = int(fields[21]) * resource.getpagesize()
        except (OSError, IndexError, ValueError):
            continue
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in tree:
                tree.add(pid)
                frontier.append(pid)
    return sum(rss.get(pid, 0) for pid in tree) / 2**20


def run_day(work: Path, requests: int, hours: float, seed: int, jobs: int) -> dict[str, Any]:
    """The command on the generated day, as a child process."""
    trace = work / "day.csv"
    began = time.perf_counter()
    rows = write_trace(trace, requests, seed, span_s=hours * 3600.0)
    print(f"day: {rows} requests over {hours:g} h ({trace.stat().st_size / 1e6:.0f} MB), "
          f"written in {time.perf_counter() - began:.0f} s", flush=True)
    (work / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    command = [sys.executable, "-m", "exporter.cli.main", "replay", "--trace", trace.name,
               "--config", "config.yaml", "--policy", POLICIES, "--out", "out",
               "--seed", str(seed), "--price-per-replica-hour", "2.5", "--no-fixed-best",
               "--progress", "never", "--jobs", str(jobs)]
    load = os.getloadavg()[0]
    cpu = _cpu_s()
    began = time.perf_counter()
    child = subprocess.Popen(command, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    peak = [0.0]

    def watch() -> None:
        while child.poll() is None:
            peak[0] = max(peak[0], _tree_rss_mb(child.pid))
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    out, err = child.communicate()
    wall = time.perf_counter() - began
    watcher.join()
    cpu_s = _cpu_s() - cpu
    if child.returncode != 0:
        print(err, file=sys.stderr)
        raise SystemExit(f"replay failed with status {child.returncode}")
    print(out)
    report = json.loads((work / "out" / "replay.json").read_text())
    ok_time, ok_memory = wall <= TIME_LIMIT_S, peak[0] <= MEMORY_LIMIT_MB
    print(f"day: wall {wall:.0f} s (limit {TIME_LIMIT_S:.0f}: {'ok' if ok_time else 'OVER'}), "
          f"CPU {cpu_s:.0f} s, peak memory {peak[0]:.0f} MB (limit {MEMORY_LIMIT_MB:.0f}: "
          f"{'ok' if ok_memory else 'OVER'}), load average {load:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after", flush=True)
    return {"requests": rows, "hours": hours, "jobs": jobs, "wall_s": wall, "cpu_s": cpu_s,
            "cpu_ms_per_request": 1000.0 * cpu_s / rows, "peak_memory_mb": peak[0],
            "load_average_before": load, "load_average_after": os.getloadavg()[0],
            "within_limits": ok_time and ok_memory, "windows": report["windows"],
            "policies": {name: {k: p[k] for k in ("mean_replicas", "met_share",
                                                  "rejected_requests")}
                         for name, p in report["policies"].items()}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--slice-requests", type=int, default=50_000)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--no-slice", action="store_true")
    parser.add_argument("--no-day", action="store_true")
    args = parser.parse_args(argv)
    run_start = start_run()
    compile_model_kernel()  # the compiled kernels from their cache (or compiled), untimed
    summary: dict[str, Any] = {"cpu_count": os.cpu_count(), "config": CONFIG,
                               "policies": POLICIES.split(","), "seed": args.seed,
                               "limits": {"wall_s": TIME_LIMIT_S, "memory_mb": MEMORY_LIMIT_MB}}
    with tempfile.TemporaryDirectory() as tmp:
        if not args.no_slice:
            summary["slice"] = run_slice(Path(tmp), args.slice_requests, args.seed, args.jobs)
        if not args.no_day:
            summary["day"] = run_day(Path(tmp), args.requests, args.hours, args.seed, args.jobs)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "replay_scale.json"
    path.write_text(json.dumps(with_run(run_start, summary), indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
