"""Soak: `vllm-sizer run` over 20 deployments for 10 minutes while faults come and go.

14 deployments are emulated vLLM fleets at loads that need 1, 2 or 3 replicas; 6 point at fault
servers whose fault changes every minute (a byte-a-second drip, a hang, an endless body, a
redirect, two pods behind one URL, counters that fall, garbage). A client floods the daemon's
API meanwhile (bounded: about 40 requests/s, malformed ones among them, plus 40 idle
connections). Three phases in turn fault healthy deployments (bench/lib/soak_phases.py): 80
clients reconnecting in a loop hold every connection while /healthz is probed once a second,
one pod of a two-replica fleet answers garbage, and a deployment read through a fake Prometheus
gets each series twice, once at 1e15. Checked and written to bench/results/soak.json:
- no cycle later than its deadline: the daemon's own account, a cycle that runs past the next
  period boundary (the cycle-time histogram's bucket at the period) or a boundary passed
  without a cycle (`vllm_sizer_cycles_skipped_total`);
- every healthy deployment's desired count within +-1 of `replicas_for_slo` at the true
  parameters and the offered load, and within the bounds, at every check after warm-up;
- every /healthz probe during the flood a 200 within 2 s;
- no faulty deployment's desired count above FAULTY_MAX_DESIRED after warm-up: their pods
  serve 2 req/s (a sixth of one replica's capacity), whatever lie they tell;
- the daemon process's RSS grows by less than 10 MB after warm-up, and its thread count does
  not grow (by more than 2): the last minute against the first minute after warm-up, RSS by
  its median and threads by their floor (the minimum), so an in-flight 32 MiB body or a burst
  of API connections (threads that end with them, at most one per deployment's read and 64
  for the server) does not decide it.

What is measured is the daemon, not the emulator. The daemon runs as its own `vllm-sizer run`
process and every emulated fleet as its own `vllm-sizer emulate` process (as every vLLM pod is
its own process): when 14 fleets shared one Python process on 2 cores they fell behind real
time, and a fleet that lags then catches up shows the daemon bursts of load that were never
offered. The fleets are also light: the true model is three times slower than Llama-3.1-8B on
the H100 with targets three times looser, which is the same sizing problem at a third of the
request rate (the model and the simulator are invariant under that change of time unit), so a
third of the simulation work. Each fleet's late ticks are reported, with the load average, so
a run on a loaded machine says whether the emulator kept up.

The true need is `replicas_for_slo` at the true parameters and the fleet's Poisson rate, for
the mean request shape of the uniform length laws the fleets draw from. The healthy
deployments start from the true parameters (`initial_params`), so what is tested is the daemon
under faults, not calibration; their tuners keep refitting from the emulated windows.

Run: .venv/bin/python -m bench.soak [--minutes 10]   (from the repository root)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.error import URLError
from urllib.request import urlopen

import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.lib.envelope import start_run, with_run
from bench.lib.soak_phases import (
    ConnectionFlood,
    DuplicatingPrometheus,
    GarbageProxy,
    active,
)
from model import ServerConfig, ServiceParams, Workload, max_rate_for_slo, replicas_for_slo
from tests.fixtures.vllm_exposition import PodTotals, render, steady_increment
from tests.reliability.fault_server import Fault, FaultServer

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "results" / "soak.json"
SLOWER = 3.0  # the true model against Llama-3.1-8B on the H100 (Table I): times x3, rates /3
TRUE = ServiceParams(6.68 * SLOWER, 2.01e-2 * SLOWER, 5.52e-5 * SLOWER)
SERVER = ServerConfig()
SHAPE = Workload(512, 128)
TTFT_MS, ITL_MS = 60.0 * SLOWER, 20.0 * SLOWER
MIN_REPLICAS, MAX_REPLICAS = 1, 6
PERIOD_S = 5
HEALTHY, FAULTY = 14, 6
FAULT_PERIOD_S = 60.0
WARMUP_S = 120.0
MAX_RSS_GROWTH_MB = 10.0
MAX_THREAD_GROWTH = 2
FAULTY_MAX_DESIRED = 2  # their true need (1) + 1, the healthy deployments' tolerance
GARBAGE_FLEET = 4  # a fleet of two replicas: its second pod is read through the proxy
DUPLICATE_FLEET = 1  # a fleet of two replicas, read again through the fake Prometheus
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


class EmulatorProcess:
    """One emulated fleet as a `vllm-sizer emulate` process; its /metrics URLs and late ticks."""

    def __init__(self, index: int, rate_rps: float, replicas: int, log: Path) -> None:
        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "exporter.cli.main", "emulate",
             "--alpha-ms", repr(TRUE.alpha_ms), "--beta-ms", repr(TRUE.beta_ms),
             "--gamma-ms", repr(TRUE.gamma_ms), "--max-batch-size", str(SERVER.max_batch_size),
             "--max-num-batched-tokens", str(SERVER.max_num_batched_tokens),
             "--input-tokens", str(int(SHAPE.avg_input_tokens)),
             "--output-tokens", str(int(SHAPE.avg_output_tokens)), "--lengths", "uniform",
             "--rate-rps", repr(rate_rps), "--replicas", str(replicas),
             "--seed", str(100 + index), "--model-name", "m"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=self._log, text=True,
        )  # fmt: skip
        self._replicas, self._name = replicas, log.name
        self.urls: list[str] = []

    def wait_serving(self) -> None:
        """Read the URLs the fleet prints once its replicas serve (the fleets start together)."""
        assert self.proc.stdout is not None
        self.urls = [self.proc.stdout.readline().strip() for _ in range(self._replicas)]
        if not all(url.startswith("http://") for url in self.urls):
            raise RuntimeError(f"an emulator did not start: {self.urls} (see {self._name})")

    def stop(self) -> int:
        """End the fleet; its late ticks as of its last status line (every 10 s)."""
        self.proc.kill()  # no cleanup to wait for; its status lines are already in the pipe
        out, _ = self.proc.communicate()
        self._log.close()
        late = re.findall(r"late ticks (\d+)", out)
        return int(late[-1]) if late else 0


def wait_until_serving(port: int, daemon: subprocess.Popen[bytes], limit_s: float = 120.0) -> None:
    """Until the daemon answers /healthz (its start can take a while on a loaded machine)."""
    give_up = time.monotonic() + limit_s
    while time.monotonic() < give_up and daemon.poll() is None:
        try:
            with urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5):
                return
        except (URLError, OSError):
            time.sleep(0.5)
    raise RuntimeError(f"the daemon did not serve within {limit_s:g} s (see run/soak/daemon.log)")


def growth(
    samples: list[dict[str, float]], key: str, of_minute: Callable[[list[float]], float]
) -> float:
    """`of_minute` of the last minute of samples minus `of_minute` of the first minute."""
    minute = max(1, int(60 / PERIOD_S))
    first = of_minute([c[key] for c in samples[:minute]])
    return of_minute([c[key] for c in samples[-minute:]]) - first


def gauge_values(families: dict[str, object], name: str) -> dict[str, float]:
    """A per-deployment gauge's value by deployment."""
    family = families[name]
    return {s.labels["deployment"]: s.value for s in family.samples}  # type: ignore[attr-defined]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to soak")
    args = parser.parse_args()
    run_start = start_run()
    duration_s = args.minutes * 60.0
    warmup_s = min(WARMUP_S, duration_s / 4)
    capacity = max_rate_for_slo(TRUE, SERVER, SHAPE, TTFT_MS, ITL_MS).rate_rps
    needs = [1 + k % 3 for k in range(HEALTHY)]
    rates = [(need - 0.5) * capacity for need in needs]  # half-way between two counts
    truth = [
        replicas_for_slo(r, TRUE, SERVER, SHAPE, TTFT_MS, ITL_MS).replicas or 0 for r in rates
    ]
    work = REPO / "run" / "soak"
    work.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    fleets = [
        EmulatorProcess(k, rates[k], needs[k], work / f"emulator-{k}.log") for k in range(HEALTHY)
    ]
    for fleet in fleets:
        fleet.wait_serving()
    faulty = [FaultyPod(k) for k in range(FAULTY)]
    port = free_port()
    for pod in faulty:
        pod.apply(0.0)
        pod.server.__enter__()
    assert needs[GARBAGE_FLEET] == needs[DUPLICATE_FLEET] == 2
    proxy = GarbageProxy(fleets[GARBAGE_FLEET].urls[1])
    proxy.server.__enter__()
    fleets[GARBAGE_FLEET].urls[1] = proxy.url
    prometheus = DuplicatingPrometheus(list(fleets[DUPLICATE_FLEET].urls)).__enter__()
    flood_phase = ConnectionFlood(port)
    common = {"model_name": "m", "slo": {"ttft_ms": TTFT_MS, "itl_ms": ITL_MS},
              "replicas": {"min": MIN_REPLICAS, "max": MAX_REPLICAS}}  # fmt: skip
    deployments = [
        {
            "name": f"healthy-{k}", **common, "initial_params": TRUE.to_dict(),
            "source": {"scrape_urls": fleet.urls, "scrape_timeout_s": 1},
            "scale_down_stabilization_s": 30,
        }  # fmt: skip
        for k, fleet in enumerate(fleets)
    ] + [
        {"name": f"faulty-{k}", **common,
         "source": {"scrape_urls": [pod.server.url], "scrape_timeout_s": 1}}  # fmt: skip
        for k, pod in enumerate(faulty)
    ] + [
        {"name": "duplicated", **common, "initial_params": TRUE.to_dict(),
         "source": {"prometheus_selector": '{namespace="soak"}'},
         "scale_down_stabilization_s": 30}  # fmt: skip
    ]
    watched = {f"healthy-{k}": truth[k] for k in range(HEALTHY)}
    watched["duplicated"] = truth[DUPLICATE_FLEET]
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump({
        "cycle_period_s": PERIOD_S, "listen_address": f"127.0.0.1:{port}",
        "prometheus": {"url": prometheus.url, "timeout_s": 2},
        "state_file": str(work / "state.json"), "log_level": "warning",
        "deployments": deployments,
    }))  # fmt: skip
    (work / "state.json").unlink(missing_ok=True)  # a soak starts fresh
    log = (work / "daemon.log").open("wb")
    daemon = subprocess.Popen(
        [sys.executable, "-m", "exporter.cli.main", "run", "--config", str(config)],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    stop = threading.Event()
    counts = {"ok": 0, "answered_error": 0, "failed": 0}
    checks: list[dict[str, float]] = []
    misses: list[dict[str, object]] = []
    faulty_max = 0.0
    excursions: list[dict[str, object]] = []  # a faulty deployment asking for more than 1
    try:
        wait_until_serving(port, daemon)
        client = threading.Thread(target=flood, args=(port, stop, counts), daemon=True)
        client.start()
        start = time.monotonic()
        while (elapsed := time.monotonic() - start) < duration_s:
            time.sleep(PERIOD_S)
            for pod in faulty:
                pod.apply(elapsed)
            proxy.garbage = active("garbage", elapsed, duration_s)
            prometheus.duplicate = active("duplicate", elapsed, duration_s)
            phase = next((p for p in ("flood", "garbage", "duplicate")
                          if active(p, elapsed, duration_s)), "")  # fmt: skip
            if active("flood", elapsed, duration_s) != flood_phase.running:
                (flood_phase.stop if flood_phase.running else flood_phase.start)()
            families = {f.name: f for f in scrape(port)}
            desired = gauge_values(families, "vllm_sizer_desired_replicas")
            rate = gauge_values(families, "vllm_sizer_arrival_rate_requests_per_second")
            cycle_s = families["vllm_sizer_cycle_duration_seconds"].samples[0].value
            rss_mb, thread_count = proc_stats(daemon.pid)
            checks.append({"t_s": round(elapsed, 1), "rss_mb": rss_mb, "threads": thread_count,
                           "last_cycle_s": round(cycle_s, 3), "phase": phase})  # fmt: skip
            if elapsed < warmup_s:
                continue
            capacity = gauge_values(families, "vllm_sizer_max_rate_per_replica_requests_per_second")
            for k, pod in enumerate(faulty):
                name = f"faulty-{k}"
                got = desired.get(name, 0.0)
                faulty_max = max(faulty_max, got)
                if got > 1:
                    excursions.append({"t_s": round(elapsed, 1), "deployment": name,
                                       "mode": pod.current, "desired": got,
                                       "rate_rps": rate.get(name),
                                       "capacity_rps": capacity.get(name)})  # fmt: skip
            for name, need in watched.items():
                got = desired.get(name)
                ok = got is not None and abs(got - need) <= 1
                if not ok or not MIN_REPLICAS <= got <= MAX_REPLICAS:  # type: ignore[operator]
                    misses.append({"t_s": round(elapsed, 1), "deployment": name, "desired": got,
                                   "truth": need, "rate_rps": rate.get(name),
                                   "phase": phase})  # fmt: skip
        families = {f.name: f for f in scrape(port)}
    finally:
        flood_phase.stop()
        stop.set()
        daemon.terminate()
        try:
            daemon.wait(timeout=10)
        except subprocess.TimeoutExpired:
            daemon.kill()
        late_ticks = [fleet.stop() for fleet in fleets]
        for pod in faulty:
            pod.server.__exit__()
        proxy.server.__exit__()
        prometheus.__exit__()
    load_after = os.getloadavg()
    buckets = {
        float(s.labels["le"]): s.value
        for s in families["vllm_sizer_cycle_seconds"].samples
        if s.name.endswith("_bucket")
    }
    cycles = buckets[float("inf")]
    late = cycles - buckets[float(PERIOD_S)]
    skipped = sum(s.value for s in families["vllm_sizer_cycles_skipped"].samples
                  if s.name.endswith("_total"))  # fmt: skip
    after = [c for c in checks if c["t_s"] >= warmup_s]
    rss_growth = growth(after, "rss_mb", statistics.median)
    # A leaked thread never ends, so it raises the floor; the threads of in-flight reads of
    # the faulty pods and of API connections come and go with the fault schedule.
    thread_growth = growth(after, "threads", min)
    threads = [int(c["threads"]) for c in after]
    result = {
        "minutes": args.minutes,
        "deployments": {"healthy": HEALTHY, "faulty": FAULTY},
        "true_params_ms": TRUE.to_dict(),
        "slo_ms": {"ttft": TTFT_MS, "itl": ITL_MS},
        "healthy_rates_rps": [round(r, 3) for r in rates],
        "healthy_true_need": truth,
        "cycles": cycles,
        "cycles_over_period": late,
        "cycles_skipped": skipped,
        "max_sampled_cycle_s": max(c["last_cycle_s"] for c in checks),
        "healthy_checks": len(after) * len(watched),
        "phases": {"flood": flood_phase.probes and {
            "healthz_probes": len(flood_phase.probes),
            "healthz_not_200": [p for p in flood_phase.probes if p["status"] != 200],
            "healthz_slowest_s": max(p["s"] for p in flood_phase.probes)},
            "duplicate_prometheus_queries": prometheus.queries},  # fmt: skip
        "healthy_misses": misses,
        "faulty_max_desired_after_warmup": faulty_max,
        "faulty_excursions": excursions,
        "rss_growth_mb_after_warmup": round(rss_growth, 2),
        "rss_mb_min_max_after_warmup": [min(c["rss_mb"] for c in after),
                                        max(c["rss_mb"] for c in after)],  # fmt: skip
        "threads_min_max_after_warmup": [min(threads), max(threads)],
        "thread_growth": thread_growth,
        "api_requests": counts,
        "daemon_exit_code": daemon.returncode,
        "emulator_late_ticks": late_ticks,
        "load_average_1_5_15_before_after": [load_before, load_after],
        "samples": checks,
    }
    OUT.write_text(json.dumps(with_run(run_start, result), indent=1) + "\n")
    api_ok = counts["failed"] == 0 and counts["ok"] > 0
    flood_ok = bool(flood_phase.probes) and all(p["status"] == 200 for p in flood_phase.probes)
    ok = (not misses and late == 0 and skipped == 0 and rss_growth < MAX_RSS_GROWTH_MB
          and thread_growth <= MAX_THREAD_GROWTH and api_ok and flood_ok
          and faulty_max <= FAULTY_MAX_DESIRED)  # fmt: skip
    print(f"soak {args.minutes:g} min, {HEALTHY} healthy + {FAULTY} faulty deployments")
    print(f"cycles {cycles:.0f}, over the {PERIOD_S} s period {late:.0f}, skipped {skipped:.0f}")
    print(f"healthy desired off by more than 1: {len(misses)} of {len(after) * len(watched)} "
          "checks (garbage-pod and duplicate-series deployments included)")  # fmt: skip
    bad_probes = [p for p in flood_phase.probes if p["status"] != 200]
    print(f"flood: /healthz {len(flood_phase.probes) - len(bad_probes)} of "
          f"{len(flood_phase.probes)} probes 200")  # fmt: skip
    print(f"faulty deployments' desired after warm-up at most {faulty_max:g} (limit "
          f"{FAULTY_MAX_DESIRED})")
    print(f"RSS growth after warm-up {rss_growth:+.1f} MB, threads {min(threads)}-{max(threads)}"
          f" (growth {thread_growth:+g}), API {counts}")  # fmt: skip
    print(f"emulator late ticks {sum(late_ticks)} (max {max(late_ticks)} in one fleet); load "
          f"average {load_before[0]:.1f} before, {load_after[0]:.1f} after")  # fmt: skip
    print(f"{'PASS' if ok else 'FAIL'}; wrote {OUT.relative_to(REPO)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
