"""One daemon cycle over 1000 deployments: wall time and peak RSS (goal: <= 10 s, <= 300 MB).

The cycle's process CPU time is printed beside its wall time: on a shared machine the wall time
also counts the time the daemon waits for a core, the CPU time does not.

Synthetic in-memory sources (no network): each deployment has two pods whose cumulative vLLM
totals grow as the model predicts at a load that drifts slowly from cycle to cycle, so every
deployment's tuner is past warm-up and refits its window in the measured cycle. Prints the
figures and writes bench/results/daemon_scale.json.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exporter.clock import ManualClock  # noqa: E402
from exporter.config import Config, DeploymentConfig, SloConfig, SourceConfig  # noqa: E402
from exporter.daemon import Daemon  # noqa: E402
from exporter.reading.sources import SourceRead  # noqa: E402
from exporter.reading.vllm_metrics import (  # noqa: E402
    CounterName,
    GaugeName,
    HistogramName,
    HistogramTotals,
    PodSample,
    SampleStatus,
)
from model import ServerConfig, ServiceParams  # noqa: E402
from model.queueing.analyzer import analyze_points  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DEPLOYMENTS = 1000
PODS = 2
CYCLE_S = 30.0
WARM_CYCLES = 7  # first read + 5 steady windows for the first fit, and one more
GOAL_S, GOAL_MB = 10.0, 300.0
TRUTH = ServiceParams(6.68, 2.01e-2, 5.52e-5)
SERVER = ServerConfig()


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


def main() -> None:
    rng = np.random.default_rng(5)
    clock = ManualClock()
    n = rng.uniform(128, 2048, DEPLOYMENTS).round()
    m = rng.uniform(64, 1024, DEPLOYMENTS).round()
    light = analyze_points(TRUTH, SERVER, n, m, np.full(DEPLOYMENTS, 1e-3))
    base = rng.uniform(0.2, 0.6) * np.asarray(light.saturation_rate_rps) * PODS
    sources = {f"dep-{k}": SyntheticSource(clock, n[k], m[k], base[k]) for k in range(DEPLOYMENTS)}
    deployments = tuple(
        DeploymentConfig(
            name=name,
            model_name="m",
            source=SourceConfig(scrape_urls=("http://x/",)),
            server=SERVER,
            slo=SloConfig(ttft_ms=500.0, itl_ms=50.0),
            max_replicas=100,
        )  # fmt: skip
        for name in sources
    )
    registry = CollectorRegistry()
    daemon = Daemon(Config(deployments=deployments), sources, registry, clock)
    durations, cpu_s = [], []
    for _ in range(WARM_CYCLES + 1):
        rates = np.array([s.rate_rps() / PODS for s in sources.values()])
        truth = analyze_points(TRUTH, SERVER, n, m, rates)
        noise = np.exp(rng.normal(0.0, 0.03, (2, DEPLOYMENTS)))
        for k, source in enumerate(sources.values()):
            source.advance(truth.ttft_ms[k] * noise[0, k], truth.itl_ms[k] * noise[1, k])
        clock.advance(CYCLE_S)
        start, start_cpu = time.perf_counter(), time.process_time()
        daemon.run_cycle()
        durations.append(time.perf_counter() - start)
        cpu_s.append(time.process_time() - start_cpu)
    scrape_start = time.perf_counter()
    exposition = generate_latest(registry)
    scrape_s = time.perf_counter() - scrape_start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    states = [rt.tuner.state.value for rt in daemon.runtimes.values()]
    cycle_s = durations[-1]
    fitted = sum(s != "warming" for s in states)
    print(
        f"{DEPLOYMENTS} deployments x {PODS} pods, cycle {len(durations)} (tuners past warm-up: "
        f"{fitted})"
    )
    print(
        f"  cycle wall time   {cycle_s:6.2f} s   (goal <= {GOAL_S:g} s) "
        f"{'met' if cycle_s <= GOAL_S else 'MISSED'}"
    )
    print(f"  cycle CPU time    {cpu_s[-1]:6.2f} s   (all threads; no waiting for a core)")
    print(
        f"  peak RSS          {peak_mb:6.0f} MB  (goal <= {GOAL_MB:g} MB) "
        f"{'met' if peak_mb <= GOAL_MB else 'MISSED'}"
    )
    print(f"  /metrics render   {scrape_s * 1e3:6.0f} ms  ({len(exposition) / 1e6:.1f} MB)")
    print(f"  earlier cycles    {', '.join(f'{d:.2f}' for d in durations[:-1])} s")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {
        "benchmark": "daemon_scale",
        "deployments": DEPLOYMENTS,
        "pods_per_deployment": PODS,
        "cycle_wall_s": cycle_s,
        "earlier_cycles_wall_s": durations[:-1],
        "cycle_cpu_s": cpu_s[-1],
        "load_average_1min": os.getloadavg()[0],
        "peak_rss_mb": peak_mb,
        "metrics_render_s": scrape_s,
        "metrics_bytes": len(exposition),
        "tuners_past_warmup": fitted,
        "goals": {"cycle_wall_s": GOAL_S, "peak_rss_mb": GOAL_MB},
    }
    (RESULTS / "daemon_scale.json").write_text(json.dumps(out, indent=2) + "\n")
    print("wrote bench/results/daemon_scale.json")


if __name__ == "__main__":
    main()
