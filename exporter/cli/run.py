"""`vllm-sizer run`: the daemon, cycling on the monotonic clock behind its HTTP server until
signalled.

The cycles are started by exporter/daemon/scheduler.py, not by APScheduler's interval trigger: that
trigger sleeps until run times on the wall clock, so a backward step of the system clock stopped
every cycle while /healthz stayed 200.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from prometheus_client import CollectorRegistry

from exporter.base.clock import Clock, SystemClock
from exporter.base.errors import ConfigError
from exporter.cli.version import package_version
from exporter.collector.arrival_sampler import build_samplers
from exporter.collector.from_config import (
    build_demand_sources,
    build_inventory_sources,
    build_sources,
    prometheus_client,
)
from exporter.config.loader import listen_problem, load_config
from exporter.config.topology import place
from exporter.config.values import Config
from exporter.daemon.daemon import Daemon
from exporter.daemon.exposition import BuildInfoCollector
from exporter.daemon.log_lines import log_unexpected
from exporter.daemon.operation_metrics import QueryMetrics, SkippedEvent
from exporter.daemon.replica_label import register_start, served_registry
from exporter.daemon.scheduler import PeriodicScheduler
from exporter.daemon.server import SizerHTTPServer
from exporter.daemon.statefile import StateFile
from model.calibration.warmup import compile_model_kernel

logger = logging.getLogger("vllm_sizer")

# After SIGTERM: how long a running cycle, then any read still in flight, may take to end before
# the process exits without them (Kubernetes' grace period is 30 s by default; we take 3).
STOP_GRACE_S = 3.0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `run` subcommand."""
    run_parser = sub.add_parser(
        "run",
        help="run the daemon with a YAML config",
        description="The daemon: every cycle_period_s it reads each configured deployment's "
        "vLLM metrics, calibrates the model and recommends replicas; it serves /metrics, "
        "/healthz, /readyz and /api/v1/predict on listen_address until SIGTERM or SIGINT.",
    )
    run_parser.add_argument("--config", "-c", required=True, help="YAML config file")
    run_parser.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="overrides the config's log_level",
    )
    run_parser.set_defaults(func=run_daemon)


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )


def _placement(config: Config, replica: str | None) -> str:
    shard = "" if config.shard is None else f", shard {config.shard.index} of {config.shard.count}"
    return shard + ("" if replica is None else f", replica {replica}")


def run_daemon(args: argparse.Namespace) -> int:
    """The daemon: cycles on a schedule, serves /metrics, /healthz, /readyz, /api/v1/predict."""
    try:
        config = load_config(Path(args.config))
    except ConfigError as exc:
        print(f"vllm-sizer: {exc}", file=sys.stderr)
        return 2
    try:
        config, replica = place(config, os.environ)  # this sizer's shard and identity
    except ConfigError as exc:
        print(f"vllm-sizer: {exc}", file=sys.stderr)
        return 2
    configure_logging(args.log_level or config.log_level)
    clock = SystemClock()
    registry = CollectorRegistry()
    registry.register(BuildInfoCollector(package_version()))
    register_start(registry, clock.time())
    statefile = StateFile(config.state_file) if config.state_file else None
    samplers = build_samplers(config.deployments, clock, config.max_response_bytes)
    # One client (and connection pool) for every query, timed into the registry.
    client = prometheus_client(config, on_query=QueryMetrics(registry).observe)
    daemon = Daemon(
        config,
        build_sources(config, clock, client),
        registry,
        clock,
        statefile,
        demand=build_demand_sources(config, client),
        samplers=samplers,
        inventory=build_inventory_sources(config, client),
    )
    unwritable = None if statefile is None else statefile.check_writable()
    if unwritable is not None:
        logger.error("state file %s cannot be written: %s", config.state_file, unwritable)
        daemon.metrics.state_save_errors.inc()

    def on_skipped(count: int) -> None:
        daemon.metrics.cycles_skipped.labels(SkippedEvent.MISSED).inc(count)
        logger.warning("%d cycle(s) skipped: the previous cycle overran its period", count)

    scheduler = PeriodicScheduler(
        daemon.run_cycle, config.cycle_period_s, clock=clock, on_skipped=on_skipped
    )
    try:
        server = SizerHTTPServer(
            config.listen_host,
            config.listen_port,
            served_registry(registry, replica),
            daemon.ready,
            daemon.predict,
            live=scheduler.alive,
            mix=daemon.predict_mix if config.fleet is not None else None,
        )
    except OSError as exc:  # port in use, address not local, ...
        print(f"vllm-sizer: {listen_problem(config, exc)}", file=sys.stderr)
        daemon.close()
        return 2
    server.start()
    logger.info(
        "listening on %s:%d, %d deployment(s), cycle every %gs%s",
        config.listen_host,
        server.port,
        len(config.deployments),
        config.cycle_period_s,
        _placement(config, replica),
    )
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        logger.info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    for sampler in samplers.values():
        sampler.start()

    def start_cycles() -> None:
        # The model's compiled kernel first (seconds when not cached), with the server already
        # answering; the scheduler's liveness window starts with it. On its own thread so that
        # a signal during the compile stops the daemon at once.
        started = clock.monotonic()
        try:
            compile_model_kernel()
        except Exception as exc:  # the cycles meet the same error, counted and logged
            log_unexpected(logger, "compiling the model kernel raised", exc)
        logger.info("model kernel ready in %.1fs", clock.monotonic() - started)
        if not stop.is_set():
            scheduler.start()

    threading.Thread(target=start_cycles, name="vllm-sizer-compile", daemon=True).start()
    try:
        stop.wait()
    finally:
        deadline_s = clock.monotonic() + STOP_GRACE_S
        if not scheduler.stop(STOP_GRACE_S):
            logger.warning("stopping without the running cycle: it took over %gs", STOP_GRACE_S)
        server.stop()
        daemon.close()
        for sampler in samplers.values():
            sampler.stop()
        _exit_if_threads_linger(clock, deadline_s)
    return 0


def _exit_if_threads_linger(clock: Clock, deadline_s: float) -> None:
    """Python waits at exit for non-daemon threads and for every ThreadPoolExecutor worker (the
    daemon's readers), daemon or not: one still in a read would hold the process past its grace
    period. So the other threads get until the deadline, and the process leaves without those
    still running: daemon threads are dropped at exit anyway, and nothing is lost that SIGKILL
    would not lose (the state file is replaced atomically)."""
    others = [
        thread for thread in threading.enumerate() if thread is not threading.current_thread()
    ]
    for thread in others:
        thread.join(max(0.0, deadline_s - clock.monotonic()))
    lingering = [thread.name for thread in others if thread.is_alive()]
    if lingering:
        logger.warning("exiting with %s still running", ", ".join(lingering))
        logging.shutdown()
        os._exit(0)
