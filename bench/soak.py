"""Soak: `vllm-sizer run` over 20 deployments for 10 minutes while faults come and go.

14 deployments are emulated vLLM fleets (real HTTP on loopback) at loads that need 1, 2 or 3
replicas; 6 point at fault servers whose fault changes every minute (a byte-a-second drip, a
hang, an endless body, a redirect, two pods behind one URL, counters that fall, garbage). A
client floods the daemon's API meanwhile (bounded: about 40 requests/s, malformed ones among
them, plus 40 idle connections). Checked and written to bench/results/soak.json:
- no cycle longer than its period (the cycle-time histogram) and no cycle skipped;
- every healthy deployment's desired count within +-1 of replicas_for_slo at the true
  parameters and load, and within the bounds, at every check after the first two minutes;
- the daemon's RSS grows by less than 10 MB after warm-up, and its thread count stays flat.

The healthy deployments start from the true parameters (`initial_params`), so what is tested
is the daemon under faults, not calibration.

Run: .venv/bin/python -m bench.soak [--minutes 10]   (from the repository root)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.error import URLError
from urllib.request import urlopen

import numpy as np
import yaml
from prometheus_client.parser import text_string_to_metric_families

from exporter.emulation.emulator import EmulatedFleet
from model import ServerConfig, ServiceParams, Workload, max_rate_for_slo, replicas_for_slo
from model.simulation.workloads import LengthDist, LengthKind
from tests.fixtures.vllm_exposition import PodTotals, render, steady_increment
from tests.reliability.fault_server import Fault, FaultServer

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "results" / "soak.json"
LLAMA = ServiceParams(6.68, 2.01e-2, 5.52e-5)
SERVER = ServerConfig()
SHAPE = Workload(512, 128)
TTFT_MS, ITL_MS = 60.0, 20.0
PERIOD_S = 5
HEALTHY, FAULTY = 14, 6
FAULT_PERIOD_S = 60.0
WARMUP_S = 120.0
MAX_RSS_GROWTH_MB = 10.0
STEP = steady_increment(
    completions=10, in_tokens=512, out_tokens=128, ttft_s=0.05, itl_s=0.01,
    queue_s=0.0, inference_s=1.3, running=3, waiting=0, kv_usage=0.1,
)  # fmt: skip


class FaultyPod:
    """A fault server whose fault changes every FAULT_PERIOD_S, in a fixed order per pod."""

    MODES = ("drip", "hang", "huge", "redirect", "round_robin", "decreasing", "garbage")

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.totals = [PodTotals(), PodTotals().plus(STEP, times=50)]
        self.turn = 0
        self.server = FaultServer(Fault.SERVE, self.body, drip_interval_s=1.0, max_seconds=30.0)

    def mode(self, elapsed_s: float) -> str:
        return self.MODES[(self.offset + int(elapsed_s // FAULT_PERIOD_S)) % len(self.MODES)]

    def apply(self, elapsed_s: float) -> None:
        mode = self.mode(elapsed_s)
        self.server.fault = {
            "drip": Fault.DRIP, "hang": Fault.HANG, "huge": Fault.HUGE,
            "redirect": Fault.REDIRECT,
        }.get(mode, Fault.SERVE)  # fmt: skip
        self.current = mode
        self.totals = [t.plus(STEP) for t in self.totals]

    def body(self) -> str:
        self.turn += 1
        if self.current == "round_robin":  # two processes behind one URL
            return render(self.totals[self.turn % 2])
        if self.current == "decreasing":
            return render(self.totals[0].plus(STEP, times=max(0, 40 - self.turn)))
        if self.current == "garbage":
            return "\x00\xff not an exposition {{{\n" * 50
        return render(self.totals[0])

    current = "serve"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape(port: int) -> list:  # type: ignore[type-arg]
    with urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return list(text_string_to_metric_families(resp.read().decode()))


def flood(port: int, stop: threading.Event, counts: dict[str, int]) -> None:
    """About 40 requests/s at the API, a quarter of them malformed, plus idle connections."""
    idle = []
    for _ in range(40):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        idle.append(sock)
    paths = [
        "/metrics", "/healthz", "/readyz", "/api/v1/predict?deployment=healthy-0&rate=5",
        "/api/v1/predict?deployment=healthy-0&rate=1e400", "/api/v1/predict?replicas=%E2%91%A0",
        "/api/v1/predict?deployment=healthy-0&rate=5&replicas=" + "9" * 5000, "/nope",
    ]  # fmt: skip
    k = 0
    while not stop.is_set():
        path = paths[k % len(paths)]
        k += 1
        try:
            with urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
                resp.read()
            counts["ok"] += 1
        except URLError as exc:  # HTTPError (4xx) is a URLError too: answered
            counts["answered_error" if hasattr(exc, "code") else "failed"] += 1
        except (OSError, TimeoutError):
            counts["failed"] += 1
        stop.wait(0.025)
    for sock in idle:
        sock.close()


def proc_stats(pid: int) -> tuple[float, int]:
    """RSS (MB) and thread count of a process."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
    return rss_kb / 1024.0, len(os.listdir(f"/proc/{pid}/task"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to soak")
    args = parser.parse_args()
    duration_s = args.minutes * 60.0
    warmup_s = min(WARMUP_S, duration_s / 4)
    capacity = max_rate_for_slo(LLAMA, SERVER, SHAPE, TTFT_MS, ITL_MS).rate_rps
    needs = [1 + k % 3 for k in range(HEALTHY)]
    rates = [(need - 0.5) * capacity for need in needs]
    truth = [
        replicas_for_slo(r, LLAMA, SERVER, SHAPE, TTFT_MS, ITL_MS).replicas or 0 for r in rates
    ]
    fleets = [
        EmulatedFleet(
            LLAMA, SERVER, rng=np.random.default_rng(100 + k), arrivals=rates[k],
            input_lengths=LengthDist(LengthKind.UNIFORM, SHAPE.avg_input_tokens),
            output_lengths=LengthDist(LengthKind.UNIFORM, SHAPE.avg_output_tokens),
            model_name="m", replicas=needs[k],
        )  # fmt: skip
        for k in range(HEALTHY)
    ]
    faulty = [FaultyPod(k) for k in range(FAULTY)]
    port = free_port()
    work = REPO / "run" / "soak"
    work.mkdir(parents=True, exist_ok=True)
    for pod in faulty:
        pod.apply(0.0)
        pod.server.__enter__()
    for fleet in fleets:
        fleet.start()
    deployments = [
        {
            "name": f"healthy-{k}", "model_name": "m",
            "source": {"scrape_urls": fleet.urls, "scrape_timeout_s": 1},
            "slo": {"ttft_ms": TTFT_MS, "itl_ms": ITL_MS}, "replicas": {"min": 1, "max": 6},
            "initial_params": LLAMA.to_dict(), "scale_down_stabilization_s": 30,
        }  # fmt: skip
        for k, fleet in enumerate(fleets)
    ] + [
        {
            "name": f"faulty-{k}", "model_name": "m",
            "source": {"scrape_urls": [pod.server.url], "scrape_timeout_s": 1},
            "slo": {"ttft_ms": TTFT_MS, "itl_ms": ITL_MS}, "replicas": {"min": 1, "max": 6},
        }  # fmt: skip
        for k, pod in enumerate(faulty)
    ]
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump({
        "cycle_period_s": PERIOD_S, "listen_address": f"127.0.0.1:{port}",
        "state_file": str(work / "state.json"), "log_level": "warning",
        "deployments": deployments,
    }))  # fmt: skip
    log = (work / "daemon.log").open("wb")
    daemon = subprocess.Popen(
        [sys.executable, "-m", "exporter.commands.cli", "run", "--config", str(config)],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    stop = threading.Event()
    counts = {"ok": 0, "answered_error": 0, "failed": 0}
    checks: list[dict[str, object]] = []
    misses: list[dict[str, object]] = []
    try:
        time.sleep(3)
        client = threading.Thread(target=flood, args=(port, stop, counts), daemon=True)
        client.start()
        start = time.monotonic()
        while (elapsed := time.monotonic() - start) < duration_s:
            time.sleep(PERIOD_S)
            for pod in faulty:
                pod.apply(elapsed)
            families = {f.name: f for f in scrape(port)}
            gauge = families["vllm_sizer_desired_replicas"]
            desired = {s.labels["deployment"]: s.value for s in gauge.samples}
            rss_mb, threads = proc_stats(daemon.pid)
            checks.append({"t_s": round(elapsed, 1), "rss_mb": rss_mb, "threads": threads})
            if elapsed < warmup_s:
                continue
            for k in range(HEALTHY):
                got = desired.get(f"healthy-{k}")
                if got is None or abs(got - truth[k]) > 1 or not 1 <= got <= 6:
                    misses.append({"t_s": round(elapsed, 1), "deployment": k, "desired": got,
                                   "truth": truth[k]})  # fmt: skip
        families = {f.name: f for f in scrape(port)}
    finally:
        stop.set()
        daemon.terminate()
        try:
            daemon.wait(timeout=10)
        except subprocess.TimeoutExpired:
            daemon.kill()
        for fleet in fleets:
            fleet.stop()
        for pod in faulty:
            pod.server.__exit__()
    buckets = {
        float(s.labels["le"]): s.value
        for s in families["vllm_sizer_cycle_seconds"].samples
        if s.name.endswith("_bucket")
    }
    cycles = buckets[float("inf")]
    late = cycles - max(v for le, v in buckets.items() if le <= PERIOD_S)
    skipped = sum(s.value for s in families["vllm_sizer_cycles_skipped"].samples
                  if s.name.endswith("_total"))  # fmt: skip
    after = [c for c in checks if float(c["t_s"]) >= warmup_s]  # type: ignore[arg-type]
    rss_growth = float(after[-1]["rss_mb"]) - float(after[0]["rss_mb"])  # type: ignore[arg-type]
    thread_counts = [int(c["threads"]) for c in after]  # type: ignore[call-overload]
    result = {
        "minutes": args.minutes,
        "deployments": {"healthy": HEALTHY, "faulty": FAULTY},
        "cycles": cycles,
        "cycles_over_period": late,
        "cycles_skipped": skipped,
        "healthy_checks": len(after) * HEALTHY,
        "healthy_misses": misses,
        "rss_growth_mb_after_warmup": rss_growth,
        "threads_min_max_after_warmup": [min(thread_counts), max(thread_counts)],
        "api_requests": counts,
        "daemon_exit_code": daemon.returncode,
        "samples": checks,
    }
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    ok = not misses and late == 0 and skipped == 0 and rss_growth < MAX_RSS_GROWTH_MB
    print(f"soak {args.minutes:g} min, {HEALTHY} healthy + {FAULTY} faulty deployments")
    print(f"cycles {cycles:.0f}, over the {PERIOD_S} s period {late:.0f}, skipped {skipped:.0f}")
    print(f"healthy desired off by more than 1: {len(misses)} of {len(after) * HEALTHY} checks")
    print(f"RSS growth after warm-up {rss_growth:+.1f} MB, threads {min(thread_counts)}-"
          f"{max(thread_counts)}, API {counts}")  # fmt: skip
    print(f"{'PASS' if ok else 'FAIL'}; wrote {OUT.relative_to(REPO)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
