"""Daemon cycles over many deployments: wall and CPU time, peak RSS, and how they grow with B
(vLLM's max_num_seqs) and with the number of deployments.

Goals (issue 19): one cycle over 1000 deployments with refits <= 4 s CPU (`time.process_time`)
at B = 256, <= 300 MB peak RSS at B = 4096. The cycle's process CPU time is printed beside its
wall time: on a shared machine the wall time also counts the time the daemon waits for a core.

Synthetic in-memory sources (no network): each deployment has two pods whose cumulative vLLM
totals grow as the model predicts at a load that drifts slowly from cycle to cycle, so every
deployment's tuner is past warm-up and refits its window in every measured cycle, and its
ITL curve in one of them; the figures are that cycle's (the costliest). Each (B,
deployments) pair runs in its own process so its peak RSS is its own. Prints the figures and
writes bench/results/daemon_scale.json.
Run: .venv/bin/python bench/daemon_scale.py [--max-num-seqs 256 1024 4096] [--deployments 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.lib.envelope import start_run, with_run  # noqa: E402
from exporter.base.clock import ManualClock  # noqa: E402
from exporter.collector.sources import SourceRead  # noqa: E402
from exporter.collector.vllm_metrics import (  # noqa: E402
    CounterName,
    GaugeName,
    HistogramName,
    HistogramTotals,
    PodSample,
    SampleStatus,
)
from exporter.config.values import Config, DeploymentConfig, SloConfig, SourceConfig  # noqa: E402
from exporter.daemon.daemon import Daemon  # noqa: E402
from model import ServerConfig, ServiceParams  # noqa: E402
from model.calibration.itl_curve import REFIT_POINTS  # noqa: E402
from model.queueing.analyzer import analyze_points  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
PODS = 2
CYCLE_S = 30.0
# First read + 5 steady windows for the first fit, then enough for the ITL curve's 8 points
# over the drifting load (model/calibration/itl_curve.py).
WARM_CYCLES = 11
# Then the cycles measured: a curve is refitted every REFIT_POINTS of them, so one of them
# refits every deployment's (their loads move in step); the figures are of the costliest.
MEASURED_CYCLES = REFIT_POINTS
GOAL_CPU_S = 4.0  # 1000 deployments at B = 256
GOAL_MB = 300.0  # 1000 deployments at B = 4096
TRUTH = ServiceParams(6.68, 2.01e-2, 5.52e-5)


class SyntheticSource:
    """Cumulative totals of PODS pods serving one request shape at a drifting load."""

    def __init__(self, clock: ManualClock, n: float, m: float, base_rps: float) -> None:
        self._clock, self._n, self._m, self._base = clock, n, m, base_rps
        self._totals = np.zeros(7)  # completions, prompt, generation, ttft_s, itl_s, gaps, tpot
        self.cycle = 0

    def advance(self, ttft_ms: float, itl_ms: float) -> None:
        """Add one window at this cycle's load with the given per-pod latencies."""
        done = self.rate_rps() / PODS * CYCLE_S
        gaps = done * (self._m - 1)
        self._totals += [done, done * self._n, done * self._m, done * ttft_ms / 1e3,
                         gaps * itl_ms / 1e3, gaps, done * itl_ms / 1e3]  # fmt: skip
        self.cycle += 1

    def rate_rps(self) -> float:
        return self._base * (1.0 + 0.2 * np.sin(0.9 * self.cycle))

    def read(self) -> SourceRead:
        c, p, g, ttft, itl, gaps, tpot = self._totals
        samples = tuple(
            PodSample(
                pod=f"pod-{k}",
                time_s=self._clock.time(),
                status=SampleStatus.OK,
                counters={
                    CounterName.REQUEST_SUCCESS: c,
                    CounterName.PROMPT_TOKENS: p,
                    CounterName.GENERATION_TOKENS: g,
                },  # fmt: skip
                histograms={
                    HistogramName.TTFT_S: HistogramTotals(ttft, c),
                    HistogramName.ITL_S: HistogramTotals(itl, gaps),
                    HistogramName.REQUEST_TPOT_S: HistogramTotals(tpot, c),
                    HistogramName.PROMPT_LEN: HistogramTotals(p, c),
                    HistogramName.GENERATION_LEN: HistogramTotals(g, c),
                },
                gauges={GaugeName.RUNNING: 10.0, GaugeName.WAITING: 0.0, GaugeName.KV_USAGE: 0.2},
            )
            for k in range(PODS)
        )
        return SourceRead(time_s=self._clock.time(), samples=samples)


def run_one(deployment_count: int, max_num_seqs: int) -> dict[str, object]:
    """WARM_CYCLES cycles, then MEASURED_CYCLES; the figures of the costliest of those."""
    server = ServerConfig(max_batch_size=max_num_seqs)
    rng = np.random.default_rng(5)
    clock = ManualClock()
    n = rng.uniform(128, 2048, deployment_count).round()
    m = rng.uniform(64, 1024, deployment_count).round()
    light = analyze_points(TRUTH, server, n, m, np.full(deployment_count, 1e-3))
    base = rng.uniform(0.2, 0.6) * np.asarray(light.saturation_rate_rps) * PODS
    sources = {
        f"dep-{k}": SyntheticSource(clock, n[k], m[k], base[k]) for k in range(deployment_count)
    }
    deployments = tuple(
        DeploymentConfig(
            name=name,
            model_name="m",
            source=SourceConfig(scrape_urls=("http://x/",)),
            server=server,
            slo=SloConfig(ttft_ms=500.0, itl_ms=50.0),
            max_replicas=100,
        )  # fmt: skip
        for name in sources
    )
    registry = CollectorRegistry()
    daemon = Daemon(Config(deployments=deployments), sources, registry, clock)
    durations, cpu_s = [], []
    for _ in range(WARM_CYCLES + MEASURED_CYCLES):
        rates = np.array([s.rate_rps() / PODS for s in sources.values()])
        truth = analyze_points(TRUTH, server, n, m, rates)
        noise = np.exp(rng.normal(0.0, 0.03, (2, deployment_count)))
        for k, source in enumerate(sources.values()):
            source.advance(truth.ttft_ms[k] * noise[0, k], truth.itl_ms[k] * noise[1, k])
        clock.advance(CYCLE_S)
        start, start_cpu = time.perf_counter(), time.process_time()
        daemon.run_cycle()
        durations.append(time.perf_counter() - start)
        cpu_s.append(time.process_time() - start_cpu)
    scrape_start = time.perf_counter()
    exposition = generate_latest(registry)
    states = [rt.cycle.tuner.state.value for rt in daemon.runtimes.values()]
    worst = WARM_CYCLES + int(np.argmax(cpu_s[WARM_CYCLES:]))
    return {
        "deployments": deployment_count,
        "max_num_seqs": max_num_seqs,
        "pods_per_deployment": PODS,
        "cycle_wall_s": durations[worst],
        "cycle_cpu_s": cpu_s[worst],
        "measured_cycles_cpu_s": cpu_s[WARM_CYCLES:],
        "earlier_cycles_wall_s": durations[:WARM_CYCLES],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "metrics_render_s": time.perf_counter() - scrape_start,
        "metrics_bytes": len(exposition),
        "tuners_past_warmup": sum(s != "warming" for s in states),
        "itl_curves": sum(rt.cycle.tuner.itl_curve is not None for rt in daemon.runtimes.values()),
        "load_average_1min": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-num-seqs", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--deployments", type=int, nargs="+", default=[250, 1000])
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # child process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.deployments[0], args.max_num_seqs[0])))
        return
    run_start = start_run()
    print(f"load average (1 min) at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'B':>5s} {'deployments':>11s} {'cycle CPU':>10s} {'wall':>8s} {'CPU/dep':>9s} "
          f"{'peak RSS':>9s} {'ITL curves':>10s}  goal")  # fmt: skip
    rows = []
    for batch in args.max_num_seqs:
        for count in args.deployments:
            child = subprocess.run(
                [sys.executable, __file__, "--one", "--max-num-seqs", str(batch),
                 "--deployments", str(count)],  # fmt: skip
                check=True, capture_output=True, text=True,
            )  # fmt: skip
            row = json.loads(child.stdout.strip().splitlines()[-1])
            goal = ""
            if count == 1000 and batch == 256:
                met = row["cycle_cpu_s"] <= GOAL_CPU_S
                goal = f"CPU <= {GOAL_CPU_S:g} s {'met' if met else 'MISSED'}"
            if count == 1000 and batch == 4096:
                met = row["peak_rss_mb"] <= GOAL_MB
                goal = f"RSS <= {GOAL_MB:g} MB {'met' if met else 'MISSED'}"
            print(
                f"{batch:5d} {count:11d} {row['cycle_cpu_s']:8.2f} s {row['cycle_wall_s']:6.2f} s "
                f"{row['cycle_cpu_s'] / count * 1e3:6.2f} ms {row['peak_rss_mb']:6.0f} MB "
                f"{row['itl_curves']:10d}  {goal}",
                flush=True,
            )
            rows.append(row)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = with_run(run_start, {
        "benchmark": "daemon_scale",
        "goals": {"cycle_cpu_s_1000_b256": GOAL_CPU_S, "peak_rss_mb_1000_b4096": GOAL_MB},
        "load_average_1min_end": os.getloadavg()[0],
        "results": rows,
    })
    (RESULTS / "daemon_scale.json").write_text(json.dumps(out, indent=2) + "\n")
    print("wrote bench/results/daemon_scale.json")


if __name__ == "__main__":
    main()
