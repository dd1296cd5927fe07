"""The daemon live on a real vLLM, read through a real Prometheus, under changing load. Issue 9.

vLLM (CPU build) runs on loopback; Debian's Prometheus scrapes its /metrics and the daemon's;
`vllm-sizer run` reads vLLM's series from that Prometheus (`prometheus_selector`) every cycle,
calibrates its tuner and exports its gauges. Before the daemon starts, this run probes vLLM on
this host (live_probe.py): the load phases are fractions of each shape's burst saturation and the
SLO targets multiples of the main shape's single-request TTFT and ITL, so the run asks the same
of a fast host and a slow one. Our load generator steps the load through phases
(two request shapes, several cycles each, started right after a daemon cycle so each window
holds one load). After every cycle this script reads the daemon's /metrics: observed and
predicted TTFT and ITL, desired and current replicas, reason, tuner state and parameters. At
the end it asks Prometheus for the daemon's series and for vLLM's metric names, then
`live_report` writes `bench/results/real_vllm_live.{md,json,png}`. vLLM, Prometheus and the
daemon are stopped whatever happens.

Run from the repository root: `python -m bench.real_vllm.live` (7-10 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.lib.envelope import start_run, with_run
from bench.real_vllm import live_report
from bench.real_vllm.live_probe import (
    CYCLE_PERIOD_S,
    MAIN,
    PROMETHEUS_SCRAPE_S,
    SECOND,
    probe,
    quiet_wait_s,
    slo_targets,
)
from bench.real_vllm.prepare import prepare
from bench.real_vllm.server import (
    LOG_DIR,
    RunningServer,
    ServerOptions,
    free_port,
    stop_on_sigterm,
    vllm_server,
)
from bench.real_vllm.sweep import Shape
from bench.real_vllm.vllm_env import WORK_DIR
from exporter.config.loader import load_config
from exporter.testbed.load_run import LoadResult, LoadSpec
from exporter.testbed.loadgen import run_load
from tests.integration.prometheus_server import PrometheusServer, Target

REPO_ROOT = Path(__file__).resolve().parents[2]
LIVE_DIR = WORK_DIR / "live"
DEPLOYMENT = "tiny-vllm"
POD = "tiny-vllm-0"
NAMESPACE = "live"
SELECTOR = f'{{namespace="{NAMESPACE}", pod=~"{DEPLOYMENT}-.*"}}'
MIN_REPLICAS = 1
MAX_REPLICAS = 8
SCALE_DOWN_STABILIZATION_S = 30.0
TUNER_MIN_OBSERVATIONS = 4
TUNER_WINDOW = 10
POLL_S = 0.5
DAEMON_STOP_GRACE_S = 10.0
SEED = 20261202


@dataclass(frozen=True, slots=True, kw_only=True)
class Phase:
    """One load step: a shape at a fraction of its burst saturation, for whole cycles."""

    shape: Shape
    fraction: float
    cycles: int


# Fractions of the burst saturation, which overstates what the engine sustains by about 25 %
# (sweep.py): 0.55 of it is about 70 % of the sustainable rate.
PHASES = (
    Phase(shape=MAIN, fraction=0.15, cycles=4),
    Phase(shape=MAIN, fraction=0.40, cycles=4),
    Phase(shape=MAIN, fraction=0.55, cycles=4),
    Phase(shape=MAIN, fraction=0.30, cycles=4),
    Phase(shape=SECOND, fraction=0.30, cycles=3),
    Phase(shape=SECOND, fraction=0.50, cycles=3),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class CycleRow:
    """One daemon cycle as its /metrics showed it (ms, req/s), with the load that ran."""

    cycle: int
    phase: int
    shape: str
    target_rate_rps: float
    cycle_time_s: float
    arrival_rate_rps: float | None
    observed_ttft_ms: float | None
    predicted_ttft_ms: float | None
    observed_itl_ms: float | None
    predicted_itl_ms: float | None
    desired_replicas: float | None
    current_replicas: float | None
    reason: str
    tuner_state: str
    tuner_reason: str
    alpha_ms: float | None
    beta_ms: float | None
    gamma_ms: float | None
    max_rate_per_replica_rps: float | None
    saturation_rate_per_replica_rps: float | None
    fit_ttft_error: float | None
    fit_itl_error: float | None


def daemon_config(prometheus_url: str, port: int, options: ServerOptions,
                  slo: tuple[float, float]) -> dict[str, Any]:
    """The daemon's YAML config: vLLM's series from Prometheus, the engine's own limits."""
    return {
        "cycle_period_s": CYCLE_PERIOD_S,
        "listen_address": f"127.0.0.1:{port}",
        "log_level": "info",
        "prometheus": {"url": prometheus_url, "timeout_s": 5},
        "deployments": [{
            "name": DEPLOYMENT,
            "model_name": "tiny",
            "source": {"prometheus_selector": SELECTOR},
            "server": {
                "max_num_seqs": options.max_num_seqs,
                "max_num_batched_tokens": options.max_num_batched_tokens,
            },
            "slo": {"ttft_ms": slo[0], "itl_ms": slo[1]},
            "replicas": {"min": MIN_REPLICAS, "max": MAX_REPLICAS},
            "scale_down_stabilization_s": SCALE_DOWN_STABILIZATION_S,
            "tuner": {"min_observations": TUNER_MIN_OBSERVATIONS, "window": TUNER_WINDOW},
        }],
    }


@contextmanager
def prometheus(targets: list[Target], workdir: Path) -> Iterator[PrometheusServer]:
    """Debian's Prometheus on loopback (the integration tests' server), always stopped."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise RuntimeError("the `prometheus` binary is not installed: run `make prometheus`")
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    server = PrometheusServer(targets, workdir=workdir, scrape_interval_s=PROMETHEUS_SCRAPE_S,
                              binary=binary)
    try:
        yield server.start()
    finally:
        server.stop()


@contextmanager
def daemon_process(config_path: Path, log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`vllm-sizer run` in its own process group; SIGTERM, then SIGKILL, however the block ends."""
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "exporter.cli.main", "run", "--config", str(config_path)],
            cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        for signum in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(process.pid, signum)
            except ProcessLookupError:
                break
            try:
                process.wait(timeout=DAEMON_STOP_GRACE_S)
                break
            except subprocess.TimeoutExpired:
                continue
        process.wait()


# Enum-style gauges of the daemon -> (key in the view, label holding the value).
ENUM_GAUGE_KEYS = {
    "vllm_sizer_recommendation_reason": ("reason", "reason"),
    "vllm_sizer_tuner_state": ("tuner_state", "state"),
    "vllm_sizer_tuner_reason": ("tuner_reason", "reason"),
}


def read_daemon(url: str) -> dict[str, Any]:
    """The daemon's /metrics: this deployment's gauges by name, its current states, the
    last cycle's time and the cycle count summed over outcomes."""
    text = requests.get(url, timeout=5.0).text
    view: dict[str, Any] = {"cycles": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm_sizer_cycles_total":
                view["cycles"] += sample.value
            elif sample.name == "vllm_sizer_last_successful_cycle_timestamp_seconds":
                view[sample.name] = sample.value
            elif sample.labels.get("deployment") != DEPLOYMENT:
                continue
            elif sample.name in ENUM_GAUGE_KEYS:
                if sample.value == 1.0:  # enum-style: the current value's series is 1
                    key, label = ENUM_GAUGE_KEYS[sample.name]
                    view[key] = sample.labels[label]
            elif sample.name == "vllm_sizer_fit_error_ratio":
                view[f"fit_{sample.labels['signal']}_error"] = sample.value
            elif family.type == "gauge":
                view[sample.name] = sample.value
    return view


def _ms(view: dict[str, Any], name: str) -> float | None:
    value = view.get(f"vllm_sizer_{name}_seconds")
    return None if value is None else value * 1000.0


def cycle_row(view: dict[str, Any], cycle: int, phase: int, rate_rps: float) -> CycleRow:
    """One table row from a /metrics read."""
    shape = PHASES[phase].shape
    return CycleRow(
        cycle=cycle, phase=phase, shape=f"{shape.input_tokens}/{shape.output_tokens}",
        target_rate_rps=rate_rps,
        cycle_time_s=view.get("vllm_sizer_last_successful_cycle_timestamp_seconds", math.nan),
        arrival_rate_rps=view.get("vllm_sizer_arrival_rate_requests_per_second"),
        observed_ttft_ms=_ms(view, "observed_ttft"),
        predicted_ttft_ms=_ms(view, "predicted_ttft"),
        observed_itl_ms=_ms(view, "observed_itl"),
        predicted_itl_ms=_ms(view, "predicted_itl"),
        desired_replicas=view.get("vllm_sizer_desired_replicas"),
        current_replicas=view.get("vllm_sizer_current_replicas"),
        reason=view.get("reason", "-"),
        tuner_state=view.get("tuner_state", "-"),
        tuner_reason=view.get("tuner_reason", "-"),
        alpha_ms=_ms(view, "model_alpha"),
        beta_ms=_ms(view, "model_beta"),
        gamma_ms=_ms(view, "model_gamma"),
        max_rate_per_replica_rps=view.get("vllm_sizer_max_rate_per_replica_requests_per_second"),
        saturation_rate_per_replica_rps=view.get(
            "vllm_sizer_saturation_rate_per_replica_requests_per_second"),
        fit_ttft_error=view.get("fit_ttft_error"),
        fit_itl_error=view.get("fit_itl_error"),
    )


async def next_cycle(url: str, daemon: subprocess.Popen[bytes], after: float) -> dict[str, Any]:
    """Poll the daemon's /metrics until its cycle count passes `after`."""
    deadline = time.monotonic() + 3 * CYCLE_PERIOD_S + 30.0
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            raise RuntimeError(f"the daemon exited with code {daemon.returncode}")
        try:
            view = await asyncio.to_thread(read_daemon, url)
        except requests.RequestException:
            view = {"cycles": -1.0}  # not listening yet
        if view["cycles"] > after:
            return view
        await asyncio.sleep(POLL_S)
    raise RuntimeError(f"the daemon ran no cycle after cycle {after:.0f} in time")


async def drive(server: RunningServer, daemon: subprocess.Popen[bytes], metrics_url: str,
                rates: list[float], rng: np.random.Generator
                ) -> tuple[list[CycleRow], list[LoadResult]]:
    """Start each phase's load right after a daemon cycle; read the daemon after every cycle."""
    view = await next_cycle(metrics_url, daemon, 0.0)
    print(f"daemon cycle 1 (first window): reason {view.get('reason')}", flush=True)
    schedule = [i for i, phase in enumerate(PHASES) for _ in range(phase.cycles)]
    tasks: list[asyncio.Task[LoadResult]] = []
    rows: list[CycleRow] = []
    try:
        for k, index in enumerate(schedule):
            if k == 0 or schedule[k - 1] != index:
                phase = PHASES[index]
                spec = LoadSpec(base_url=server.base_url, model=server.model,
                                rate_rps=rates[index], input_tokens=phase.shape.input_tokens,
                                output_tokens=phase.shape.output_tokens,
                                duration_s=phase.cycles * CYCLE_PERIOD_S + POLL_S)
                tasks.append(asyncio.create_task(run_load(spec, rng)))
            view = await next_cycle(metrics_url, daemon, view["cycles"])
            row = cycle_row(view, k + 2, index, rates[index])
            rows.append(row)
            print(live_report.row_line(row), flush=True)
        return rows, list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _instant(prom_url: str, query: str, time_s: float) -> list[dict[str, Any]]:
    """An instant query's result list."""
    params: dict[str, str | float] = {"query": query, "time": time_s}
    body = requests.get(f"{prom_url}/api/v1/query", params=params, timeout=10.0).json()
    return list(body["data"]["result"])


def prometheus_checks(prom_url: str, start_s: float, end_s: float) -> dict[str, Any]:
    """What Prometheus holds: vLLM's metric names as stored, and the daemon's series."""
    names = requests.get(f"{prom_url}/api/v1/label/__name__/values", timeout=10.0).json()["data"]
    vllm_names = sorted(n for n in names if n.startswith("vllm") and
                        not n.startswith("vllm_sizer_"))
    sizer_names = sorted(n for n in names if n.startswith("vllm_sizer_"))
    span = f"{max(1, math.ceil(end_s - start_s))}s"
    counts: dict[str, float] = {}
    for name in ("desired_replicas", "predicted_ttft_seconds", "observed_ttft_seconds",
                 "predicted_itl_seconds", "observed_itl_seconds", "model_alpha_seconds"):
        query = f'count_over_time(vllm_sizer_{name}{{deployment="{DEPLOYMENT}"}}[{span}])'
        samples = _instant(prom_url, query, end_s)
        counts[name] = float(samples[0]["value"][1]) if samples else 0.0
    problems: dict[str, float] = {}
    for name, label in (("observation_problems_total", "problem"),
                        ("scrape_errors_total", "reason")):
        query = f'vllm_sizer_{name}{{deployment="{DEPLOYMENT}"}}'
        for sample in _instant(prom_url, query, end_s):
            problems[f"{name}{{{label}={sample['metric'].get(label)}}}"] = float(
                sample["value"][1])
    return {
        "daemon_counters": problems,
        "vllm_names_with_colon": sum(1 for n in vllm_names if n.startswith("vllm:")),
        "vllm_names_with_underscore": sum(1 for n in vllm_names if n.startswith("vllm_")),
        "vllm_names": vllm_names,
        "sizer_names": sizer_names,
        "sizer_names_with_colon": sum(1 for n in sizer_names if ":" in n),
        "sizer_sample_counts": counts,
    }


def main(argv: list[str] | None = None) -> int:
    """CLI: prepare, start vLLM, Prometheus and the daemon, drive the load, write the report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path, default=live_report.RESULTS_DIR)
    args = parser.parse_args(argv)
    stop_on_sigterm()
    run_start = start_run()
    started = time.monotonic()
    prepare()
    LIVE_DIR.mkdir(parents=True, exist_ok=True)
    options = ServerOptions()
    rng = np.random.default_rng(SEED)
    daemon_port = free_port()
    with vllm_server(options, log_name="live") as server:
        print(f"vLLM ready in {server.startup_s:.0f} s on port {server.port}", flush=True)
        targets = [
            Target(server.metrics_url, labels={"namespace": NAMESPACE, "pod": POD}),
            Target(f"http://127.0.0.1:{daemon_port}/metrics", labels={"namespace": "sizer"}),
        ]
        with prometheus(targets, LIVE_DIR / "prometheus") as prom:
            probes = asyncio.run(probe(server, rng))
            probe_end_s = time.monotonic()
            main_shape = f"{MAIN.input_tokens}/{MAIN.output_tokens}"
            slo = slo_targets(probes[main_shape])
            print(f"SLO targets from the {main_shape} probe: TTFT {slo[0]:g} ms, ITL {slo[1]:g} ms",
                  flush=True)
            rates = [PHASES[i].fraction * probes[f"{p.shape.input_tokens}/"
                                                 f"{p.shape.output_tokens}"].saturation_rps
                     for i, p in enumerate(PHASES)]
            config_path = LIVE_DIR / "daemon.yaml"
            config = daemon_config(prom.base_url, daemon_port, options, slo)
            config_path.write_text(yaml.safe_dump(config, sort_keys=False))
            time.sleep(quiet_wait_s(probe_end_s, time.monotonic()))
            run_start_s = time.time()
            with daemon_process(config_path, LOG_DIR / "live-daemon.log") as daemon:
                metrics_url = f"http://127.0.0.1:{daemon_port}/metrics"
                rows, loads = asyncio.run(drive(server, daemon, metrics_url, rates, rng))
                # One more scrape of the daemon, so Prometheus holds its last cycle too.
                prom.wait_for_scrape(after_s=time.time())
                checks = prometheus_checks(prom.base_url, run_start_s, time.time())
            startup_s = server.startup_s
    wall_s = time.monotonic() - started
    variant = load_config(config_path).deployments[0].model.variant.value
    document = live_report.document(
        rows=rows, loads=loads, probes=probes, checks=checks, config=config, variant=variant,
        phases=PHASES, rates=rates, startup_s=startup_s, wall_s=wall_s, seed=SEED,
    )
    written = live_report.write(with_run(run_start, document), args.out_dir)
    print(f"wrote {', '.join(str(p) for p in written)} ({wall_s:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
