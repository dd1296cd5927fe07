"""`make run` = `vllm-sizer demo`: emulated vLLM replicas, the paper's load ramp, the real daemon.

Emulated replicas (paper Table I Llama parameters) serve vLLM's /metrics on loopback; their
load follows the paper's 44-minute profile (Table IV) in compressed time. The real daemon
scrapes them over HTTP every cycle, calibrates from nothing, and its desired replica count is
applied to the fleet after a startup delay, standing in for KEDA. Prints a live table, then a
summary, and writes a PNG of the run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry

from exporter.base.clock import SystemClock
from exporter.cli.demo_report import (
    HEADER,
    CycleRow,
    RunSetting,
    line,
    params_text,
    plot_run,
    summary,
    tuner_note,
)
from exporter.cli.fleet_options import MAX_DURATION_S, MAX_TIME_SCALE, int_flag, number_flag
from exporter.cli.version import package_version
from exporter.collector.sources import ScrapeSource, SourceRead
from exporter.config.values import Config, DeploymentConfig, SloConfig, SourceConfig
from exporter.daemon.daemon import Daemon
from exporter.daemon.exposition import BuildInfoCollector
from exporter.daemon.server import SizerHTTPServer
from exporter.testbed.emulator import EmulatedFleet
from model import ServerConfig, ServiceParams
from model.calibration.warmup import compile_model_kernel
from model.simulation.workloads import PAPER_PROFILE_SEGMENTS, LengthDist, LengthKind, RateProfile

TRUE_PARAMS = ServiceParams(6.68, 2.01e-2, 5.52e-5)  # paper Table I, Llama-3.1-8B on H100 (ms)
NAME = "llama-demo"
BASE_RPS = 5.0  # 300 RPM: the paper's TTFT-bound scenario (Table III)
SLO_TTFT_MS = 50.0
SLO_ITL_MS = 25.0
SLO = SloConfig(ttft_ms=SLO_TTFT_MS, itl_ms=SLO_ITL_MS)
CYCLE_S = 30.0  # simulated seconds, as the paper's windows
STARTUP_DELAY_S = 90.0  # simulated seconds until a new replica serves
# The length laws the demo offers; the CV applies to lognormal only (uniform has its own).
DEMO_LENGTHS = (LengthKind.UNIFORM, LengthKind.LOGNORMAL)
DEMO_LOGNORMAL_CV = 1.0
PROFILE_MINUTES = sum(minutes for minutes, _, _ in PAPER_PROFILE_SEGMENTS)


class FleetSource:
    """Scrapes whichever emulated replicas are serving this cycle."""

    def __init__(self, fleet: EmulatedFleet) -> None:
        self._fleet = fleet

    def read(self) -> SourceRead:
        # Bring the simulation up to the clock first: on a busy machine the emulator thread can
        # lag, and a scrape must see the metrics of the instant it is stamped with.
        self._fleet.sync()
        return ScrapeSource(
            clock=self._fleet.sim_clock, urls=self._fleet.urls, model_name=NAME, timeout_s=5.0
        ).read()


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `demo` subcommand."""
    demo = sub.add_parser(
        "demo",
        help="the embedded demo: emulated vLLM fleet + real daemon",
        description="The `make run` demo: emulated vLLM replicas under the paper's 44-minute "
        "load profile in compressed time, sized by the real daemon, whose recommendation is "
        "applied to the fleet after a startup delay. Prints one line per cycle and a summary, "
        "and writes OUT/demo.png.",
    )
    demo.add_argument(
        "--time-scale",
        type=number_flag(0.0, MAX_TIME_SCALE, low_inclusive=False),
        default=15.0,
        help="simulated seconds per wall second; 15 runs the 44 minutes in about 3",
    )
    demo.add_argument(
        "--minutes",
        type=number_flag(CYCLE_S / 60.0, PROFILE_MINUTES),  # at least one cycle
        default=PROFILE_MINUTES,
        help="simulated minutes of the paper's profile to run",
    )
    demo.add_argument(
        "--look-ahead-s",
        type=number_flag(0.0, MAX_DURATION_S),
        default=STARTUP_DELAY_S,
        help="size for the rising load trend this many simulated seconds ahead (the config's "
        "look_ahead_s; one startup delay, so new replicas are ready when the load arrives; 0: "
        "size for the current load)",
    )
    demo.add_argument(
        "--lengths",
        choices=[k.value for k in DEMO_LENGTHS],
        default=LengthKind.UNIFORM.value,
        help="law of the prompt and output lengths (means 1024 / 512): uniform on [x/2, 3x/2], "
        f"or lognormal with CV {DEMO_LOGNORMAL_CV:g} as public chat traces have (the sizer "
        "measures the spread from vLLM's length histograms)",
    )
    demo.add_argument("--seed", type=int_flag(0), default=1, help="random seed of the workload")
    demo.add_argument("--out", type=Path, default=Path("run"), help="directory of demo.png")
    demo.add_argument(
        "--port", type=int_flag(0, 65535), default=0, help="daemon HTTP port (0: any free port)"
    )
    demo.set_defaults(func=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    try:  # before the run, not after minutes of it
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        problem = f"argument --out: cannot create {args.out} ({exc.strerror})"
        print(f"vllm-sizer demo: error: {problem}", file=sys.stderr)
        return 2
    # The model's kernel is compiled before the emulated clock starts: a first run compiles it
    # (seconds, a minute on a loaded machine), which would stall the first cycles while the
    # fleet's time runs on and leave them to read bunched, distorted windows.
    print("vllm-sizer demo: preparing the model (compiled on the first run, then cached)")
    compile_model_kernel()
    rng = np.random.default_rng(args.seed)
    profile = RateProfile.paper(BASE_RPS)
    duration_s = min(args.minutes * 60.0, profile.duration_s)
    server = ServerConfig()
    fleet = EmulatedFleet(
        TRUE_PARAMS,
        server,
        rng=rng,
        arrivals=profile,
        input_lengths=LengthDist(LengthKind(args.lengths), 1024, DEMO_LOGNORMAL_CV),
        output_lengths=LengthDist(LengthKind(args.lengths), 512, DEMO_LOGNORMAL_CV),
        model_name=NAME,
        replicas=1,
        time_scale=args.time_scale,
        startup_delay_s=STARTUP_DELAY_S,
    )
    deployment = DeploymentConfig(
        name=NAME,
        model_name=NAME,
        source=SourceConfig(scrape_urls=("http://127.0.0.1/",)),
        server=server,
        slo=SLO,
        min_replicas=1,
        max_replicas=8,
        scale_down_stabilization_s=300.0,
        look_ahead_s=args.look_ahead_s,
    )
    setting = RunSetting(
        slo_ttft_ms=SLO_TTFT_MS,
        slo_itl_ms=SLO_ITL_MS,
        cycle_s=CYCLE_S,
        startup_delay_s=STARTUP_DELAY_S,
        look_ahead_s=args.look_ahead_s,
        true_params=TRUE_PARAMS,
    )
    config = Config(cycle_period_s=CYCLE_S, deployments=(deployment,))
    registry = CollectorRegistry()
    registry.register(BuildInfoCollector(package_version()))
    rows: list[CycleRow] = []
    with fleet:
        # Cycles run on simulated time; what /metrics exports is timed on the wall clock.
        daemon = Daemon(
            config,
            {NAME: FleetSource(fleet)},
            registry,
            fleet.sim_clock,
            wall_clock=SystemClock(),
        )
        try:
            http = SizerHTTPServer("127.0.0.1", args.port, registry, daemon.ready, daemon.predict)
        except OSError as exc:  # the port is taken
            problem = f"argument --port: cannot listen on 127.0.0.1:{args.port} ({exc.strerror})"
            print(f"vllm-sizer demo: error: {problem}", file=sys.stderr)
            return 2
        http.start()
        print(
            f"vllm-sizer demo: {duration_s / 60:.0f} simulated minutes at {args.time_scale:g}x, "
            f"SLO TTFT {SLO.ttft_ms:g} ms / ITL {SLO.itl_ms:g} ms, true parameters "
            f"{params_text(TRUE_PARAMS)}; look-ahead {args.look_ahead_s:g} s; {args.lengths} "
            f"lengths{f' CV {DEMO_LOGNORMAL_CV:g}' if args.lengths == LengthKind.LOGNORMAL else ''}"
        )
        print(
            f"daemon metrics: http://127.0.0.1:{http.port}/metrics  what-if: "
            f"http://127.0.0.1:{http.port}/api/v1/predict?deployment={NAME}&rate=10\n"
        )
        print(HEADER)
        try:
            next_s = CYCLE_S
            explained: set[tuple[str, str]] = set()
            while next_s <= duration_s:
                wait_wall = (next_s - fleet.sim_time_s) / args.time_scale
                if wait_wall > 0:
                    time.sleep(wait_wall)
                if fleet.error is not None:
                    raise RuntimeError(f"emulator stopped: {fleet.error}")
                row = _cycle(daemon, fleet, profile)
                if (row.tuner, row.tuner_reason) not in explained:  # once each: no flapping
                    explained.add((row.tuner, row.tuner_reason))
                    print(tuner_note(row))
                rows.append(row)
                print(line(row), flush=True)
                next_s += CYCLE_S
        finally:
            http.stop()
    stats = fleet.stats()
    print(summary(rows, setting, stats.behind_ticks, stats.ticks))
    png = args.out / "demo.png"
    plot_run(rows, png, profile, setting)
    print(f"\nwrote {png}")
    return 0


def _cycle(daemon: Daemon, fleet: EmulatedFleet, profile: RateProfile) -> CycleRow:
    snapshot = daemon.run_cycle()
    status = snapshot.deployments[0]
    decision = status.decision
    if decision.desired_replicas is not None:
        fleet.set_replicas(decision.desired_replicas)  # KEDA's part
    t_s = fleet.sim_time_s
    return CycleRow(
        t_s=t_s,
        true_rate_rps=float(profile.rate_at(t_s)),
        arrival_rate_rps=decision.arrival_rate_rps,
        current=decision.current_replicas,
        desired=decision.desired_replicas,
        reason=decision.reason.value,
        observed_ttft_ms=status.observed_ttft_ms,
        predicted_ttft_ms=decision.predicted_ttft_ms,
        observed_itl_ms=status.observed_itl_ms,
        predicted_itl_ms=decision.predicted_itl_ms,
        tuner=status.tuner_state.value,
        tuner_reason=status.tuner_reason.value,
        params=status.params,
    )
