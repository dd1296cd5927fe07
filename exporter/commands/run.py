"""`vllm-sizer run`: the daemon, cycling on a schedule behind its HTTP server until signalled."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

from apscheduler.events import (
    EVENT_JOB_ERROR,
    EVENT_JOB_MAX_INSTANCES,
    EVENT_JOB_MISSED,
    JobExecutionEvent,
)
from apscheduler.schedulers.background import BackgroundScheduler
from prometheus_client import CollectorRegistry

from exporter.clock import SystemClock
from exporter.commands.version import package_version
from exporter.config_loader import load_config
from exporter.daemon import Daemon, build_sources
from exporter.errors import ConfigError
from exporter.exposition import BuildInfoCollector
from exporter.operation_metrics import SkippedEvent
from exporter.server import SizerHTTPServer
from exporter.statefile import StateFile

logger = logging.getLogger("vllm_sizer")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `run` subcommand."""
    run_parser = sub.add_parser("run", help="run the daemon with a YAML config")
    run_parser.add_argument("--config", "-c", required=True, help="YAML config file")
    run_parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    run_parser.set_defaults(func=run_daemon)


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )


def run_daemon(args: argparse.Namespace) -> int:
    """The daemon: cycles on a schedule, serves /metrics, /healthz, /readyz, /api/v1/predict."""
    try:
        config = load_config(Path(args.config))
    except ConfigError as exc:
        print(f"vllm-sizer: {exc}", file=sys.stderr)
        return 2
    configure_logging(args.log_level or config.log_level)
    clock = SystemClock()
    registry = CollectorRegistry()
    registry.register(BuildInfoCollector(package_version()))
    statefile = StateFile(config.state_file) if config.state_file else None
    daemon = Daemon(config, build_sources(config, clock), registry, clock, statefile)
    server = SizerHTTPServer(
        config.listen_host, config.listen_port, registry, daemon.ready, daemon.predict
    )
    server.start()
    logger.info(
        "listening on %s:%d, %d deployment(s), cycle every %gs",
        config.listen_host,
        server.port,
        len(config.deployments),
        config.cycle_period_s,
    )
    scheduler = BackgroundScheduler()

    def on_event(event: JobExecutionEvent) -> None:
        code = event.code
        if code == EVENT_JOB_ERROR:
            logger.error("cycle raised: %s", event.exception)
            return
        event_name = SkippedEvent.MISSED if code == EVENT_JOB_MISSED else SkippedEvent.MAX_INSTANCES
        daemon.metrics.cycles_skipped.labels(event_name).inc()
        logger.warning("cycle %s: the previous cycle was still running", event_name)

    scheduler.add_listener(on_event, EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES | EVENT_JOB_ERROR)
    scheduler.add_job(
        daemon.run_cycle,
        "interval",
        seconds=config.cycle_period_s,
        max_instances=1,
        coalesce=True,
        misfire_grace_time=int(config.cycle_period_s),
        next_run_time=datetime.now(UTC),
    )
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        logger.info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    scheduler.start()
    try:
        stop.wait()
    finally:
        scheduler.shutdown(wait=True)
        server.stop()
    return 0
