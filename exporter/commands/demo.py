"""`make run` = `vllm-sizer demo`: emulated vLLM replicas, the paper's load ramp, the real daemon.

Emulated replicas (paper Table I Llama parameters) serve vLLM's /metrics on loopback; their
load follows the paper's 44-minute profile (Table IV) in compressed time. The real daemon
scrapes them over HTTP every cycle, calibrates from nothing, and its desired replica count is
applied to the fleet after a startup delay, standing in for KEDA. Prints a live table, then a
summary, and writes a PNG of the run.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry

from exporter.clock import SystemClock
from exporter.commands.fleet_options import MAX_TIME_SCALE, int_flag, number_flag
from exporter.commands.version import package_version
from exporter.config import Config, DeploymentConfig, SloConfig, SourceConfig
from exporter.daemon import Daemon
from exporter.emulation.emulator import EmulatedFleet
from exporter.exposition import BuildInfoCollector
from exporter.reading.sources import ScrapeSource, SourceRead
from exporter.server import SizerHTTPServer
from model import ServerConfig, ServiceParams
from model.simulation.workloads import PAPER_PROFILE_SEGMENTS, LengthDist, LengthKind, RateProfile

TRUE_PARAMS = ServiceParams(6.68, 2.01e-2, 5.52e-5)  # paper Table I, Llama-3.1-8B on H100 (ms)
NAME = "llama-demo"
BASE_RPS = 5.0  # 300 RPM: the paper's TTFT-bound scenario (Table III)
SLO_TTFT_MS = 50.0
SLO_ITL_MS = 25.0
SLO = SloConfig(ttft_ms=SLO_TTFT_MS, itl_ms=SLO_ITL_MS)
CYCLE_S = 30.0  # simulated seconds, as the paper's windows
STARTUP_DELAY_S = 90.0  # simulated seconds until a new replica serves
PROFILE_MINUTES = sum(minutes for minutes, _, _ in PAPER_PROFILE_SEGMENTS)


@dataclass(frozen=True, slots=True, kw_only=True)
class CycleRow:
    """One cycle of the demo, for the table, the summary and the plot; s, req/s, ms."""

    t_s: float
    true_rate_rps: float
    arrival_rate_rps: float | None
    current: int | None
    desired: int | None
    reason: str
    observed_ttft_ms: float | None
    predicted_ttft_ms: float | None
    observed_itl_ms: float | None
    predicted_itl_ms: float | None
    tuner: str
    params: ServiceParams | None


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
    rng = np.random.default_rng(args.seed)
    profile = RateProfile.paper(BASE_RPS)
    duration_s = min(args.minutes * 60.0, profile.duration_s)
    server = ServerConfig()
    fleet = EmulatedFleet(
        TRUE_PARAMS,
        server,
        rng=rng,
        arrivals=profile,
        input_lengths=LengthDist(LengthKind.UNIFORM, 1024),
        output_lengths=LengthDist(LengthKind.UNIFORM, 512),
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
            f"{_params_text(TRUE_PARAMS)}"
        )
        print(
            f"daemon metrics: http://127.0.0.1:{http.port}/metrics  what-if: "
            f"http://127.0.0.1:{http.port}/api/v1/predict?deployment={NAME}&rate=10\n"
        )
        print(_HEADER)
        try:
            next_s = CYCLE_S
            while next_s <= duration_s:
                wait_wall = (next_s - fleet.sim_time_s) / args.time_scale
                if wait_wall > 0:
                    time.sleep(wait_wall)
                if fleet.error is not None:
                    raise RuntimeError(f"emulator stopped: {fleet.error}")
                row = _cycle(daemon, fleet, profile)
                rows.append(row)
                print(_line(row), flush=True)
                next_s += CYCLE_S
        finally:
            http.stop()
    print(_summary(rows, fleet))
    png = args.out / "demo.png"
    plot_run(rows, png, profile)
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
        tuner=status.tuner_state,
        params=status.params,
    )


_HEADER = (
    f"{'t min':>6} {'load rps':>8} {'est rps':>8} {'rep':>3} {'->':>2} {'want':>4} "
    f"{'TTFT obs/pred ms':>17} {'ITL obs/pred ms':>16}  {'tuner':8} reason"
)


def _num(value: float | None, width: int, digits: int = 1) -> str:
    if value is None:
        return "-".rjust(width)
    return ("inf" if math.isinf(value) else f"{value:.{digits}f}").rjust(width)


def _line(r: CycleRow) -> str:
    return (
        f"{r.t_s / 60:6.1f} {r.true_rate_rps:8.2f} {_num(r.arrival_rate_rps, 8, 2)} "
        f"{_num(r.current, 3, 0)} -> {_num(r.desired, 4, 0)} "
        f"{_num(r.observed_ttft_ms, 8)}/{_num(r.predicted_ttft_ms, 8)} "
        f"{_num(r.observed_itl_ms, 7)}/{_num(r.predicted_itl_ms, 8)}  {r.tuner:8} {r.reason}"
    )


def _params_text(p: ServiceParams | None) -> str:
    if p is None:
        return "none"
    return f"alpha {p.alpha_ms:.3g} ms, beta {p.beta_ms:.3g} ms, gamma {p.gamma_ms:.3g} ms"


def _summary(rows: list[CycleRow], fleet: EmulatedFleet) -> str:
    measured = [r for r in rows if r.observed_ttft_ms is not None]
    ttfts = [r.observed_ttft_ms for r in measured if r.observed_ttft_ms is not None]
    ttft_over = sum(1 for ttft in ttfts if ttft > SLO_TTFT_MS)
    itl_over = sum(1 for r in measured if (r.observed_itl_ms or 0.0) > SLO_ITL_MS)
    counts = [r.current for r in rows if r.current is not None]
    final = rows[-1].params if rows else None
    lines = [
        "\nsummary",
        f"  cycles: {len(rows)} ({len(measured)} with latency observations)",
        f"  SLO violations: TTFT > {SLO.ttft_ms:g} ms in {ttft_over} cycles, "
        f"ITL > {SLO.itl_ms:g} ms in {itl_over} cycles",
        f"  replicas: mean {np.mean(counts):.2f}, peak {max(counts)}"
        if counts
        else "  replicas: -",
        f"  fitted parameters: {_params_text(final)}",
        f"  true parameters:   {_params_text(TRUE_PARAMS)}",
        f"  emulator: {fleet.stats().behind_ticks} late ticks of {fleet.stats().ticks}",
    ]
    if final is not None:
        errors = [
            abs(f / t - 1.0) for f, t in zip(final.as_tuple(), TRUE_PARAMS.as_tuple(), strict=True)
        ]
        lines.append(
            "  parameter error: "
            + ", ".join(
                f"{n} {100 * e:.1f}%"
                for n, e in zip(("alpha", "beta", "gamma"), errors, strict=True)
            )
        )
    return "\n".join(lines)


def plot_run(rows: list[CycleRow], path: Path, profile: RateProfile) -> None:
    """Load, replicas, TTFT and ITL (observed and predicted, with SLO lines) vs time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.array([r.t_s / 60 for r in rows])

    def series(values: list[float | None]) -> np.ndarray:
        return np.array([np.nan if v is None or math.isinf(v) else v for v in values], float)

    fig, axes = plt.subplots(4, 1, figsize=(10, 11), sharex=True)
    grid = np.linspace(0.0, t[-1] * 60 if len(t) else 1.0, 400)
    axes[0].plot(grid / 60, profile.rate_at(grid), color="0.6", label="offered load (true)")
    axes[0].plot(
        t, series([r.arrival_rate_rps for r in rows]), "o-", ms=3, label="arrival rate (estimated)"
    )
    axes[0].set(ylabel="req/s", title="load")
    axes[1].step(t, series([r.current for r in rows]), where="post", label="current replicas")
    axes[1].step(
        t, series([r.desired for r in rows]), where="post", linestyle="--", label="desired replicas"
    )
    axes[1].set(ylabel="replicas", title="replicas")
    for ax, name, obs, pred, target in (
        (
            axes[2],
            "TTFT",
            [r.observed_ttft_ms for r in rows],
            [r.predicted_ttft_ms for r in rows],
            SLO.ttft_ms,
        ),
        (
            axes[3],
            "ITL",
            [r.observed_itl_ms for r in rows],
            [r.predicted_itl_ms for r in rows],
            SLO.itl_ms,
        ),
    ):
        ax.plot(t, series(obs), "o-", ms=3, label=f"observed {name}")
        ax.plot(t, series(pred), "s--", ms=3, label=f"predicted {name}")
        ax.axhline(target, color="red", linewidth=1, label=f"{name} target")
        ax.set(ylabel="ms", title=name)
    axes[3].set(xlabel="time (simulated minutes)")
    for ax in axes:
        ax.legend(loc="upper left", fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
