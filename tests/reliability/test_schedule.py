"""The cycle schedule runs on monotonic time: wall-clock steps neither stop nor bunch cycles, an
overrun skips (and counts) boundaries, a stuck cycle fails liveness, and SIGTERM ends the daemon
within 5 s even mid-cycle."""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.error import URLError
from urllib.request import urlopen

import pytest
import yaml

from exporter.base.clock import ManualClock, SystemClock
from exporter.daemon.scheduler import LIVE_PERIODS, PeriodicScheduler, next_start

PERIOD_S = 30.0
REPO = Path(__file__).resolve().parents[2]


class FakeTime:
    """Monotonic time moves only when the scheduler waits (or a cycle says it took time); the
    wait ends the loop once `cycles` cycles have run."""

    def __init__(self, cycles: int) -> None:
        self.clock = ManualClock()
        self.cycles = cycles
        self.starts: list[tuple[float, float]] = []  # (monotonic, wall) of each cycle's start
        self.waits: list[float] = []
        self.skipped: list[int] = []
        self.done = threading.Event()

    def wait(self, event: threading.Event, timeout_s: float) -> bool:
        if len(self.starts) >= self.cycles:
            self.done.set()
            return True
        self.waits.append(timeout_s)
        self.clock.advance(timeout_s)
        return event.is_set()

    def run(self, during: Callable[[int], None] = lambda _: None) -> PeriodicScheduler:
        def job() -> None:
            self.starts.append((self.clock.monotonic(), self.clock.time()))
            during(len(self.starts))

        scheduler = PeriodicScheduler(
            job, PERIOD_S, clock=self.clock, on_skipped=self.skipped.append, wait=self.wait
        )
        scheduler.start()
        assert self.done.wait(5.0)
        assert scheduler.stop(5.0)
        return scheduler


def test_next_start_keeps_the_phase_and_counts_passed_boundaries() -> None:
    assert next_start(0.0, 1.0, PERIOD_S) == (30.0, 0)  # on time
    assert next_start(30.0, 60.0, PERIOD_S) == (60.0, 0)  # ended on the boundary: start now
    assert next_start(30.0, 60.5, PERIOD_S) == (90.0, 1)  # overran by a little: skip one
    assert next_start(30.0, 105.0, PERIOD_S) == (120.0, 2)


def test_wall_clock_steps_of_an_hour_neither_stop_nor_bunch_cycles() -> None:
    def step(cycle: int) -> None:
        if cycle == 3:
            fake.clock.step_wall(-3600.0)  # NTP corrects a clock an hour fast
        elif cycle == 6:
            fake.clock.step_wall(+3600.0)

    fake = FakeTime(cycles=10)
    fake.run(step)
    assert [mono for mono, _ in fake.starts] == [PERIOD_S * i for i in range(10)]
    assert fake.waits == [PERIOD_S] * 9  # no hour-long sleep, no zero-length catch-up
    assert fake.skipped == []
    walls = [wall for _, wall in fake.starts]
    assert walls[3] - walls[2] == PERIOD_S - 3600.0  # the steps did happen
    assert walls[6] - walls[5] == PERIOD_S + 3600.0


def test_an_overrun_is_followed_at_the_next_boundary_and_the_skipped_are_counted() -> None:
    def overrun(cycle: int) -> None:
        if cycle == 2:
            fake.clock.advance(2.5 * PERIOD_S)

    fake = FakeTime(cycles=4)
    fake.run(overrun)
    assert [mono for mono, _ in fake.starts] == [0.0, 30.0, 120.0, 150.0]
    assert fake.skipped == [2]


def test_a_failing_cycle_does_not_end_the_schedule(caplog: pytest.LogCaptureFixture) -> None:
    def fail(cycle: int) -> None:
        if cycle == 2:
            raise RuntimeError("cycle bug")

    fake = FakeTime(cycles=4)
    with caplog.at_level(logging.DEBUG, logger="exporter.daemon.scheduler"):
        fake.run(fail)
    assert len(fake.starts) == 4
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in errors] == ["cycle raised: RuntimeError: cycle bug"]
    assert errors[0].exc_info is None  # one line: the traceback only at debug
    traced = [r for r in caplog.records if r.exc_info is not None]
    assert [r.levelno for r in traced] == [logging.DEBUG]


def test_a_cycle_stuck_for_three_periods_fails_liveness() -> None:
    clock = ManualClock()
    entered, release = threading.Event(), threading.Event()

    def stuck() -> None:
        entered.set()
        release.wait(5.0)

    scheduler = PeriodicScheduler(stuck, PERIOD_S, clock=clock, on_skipped=lambda _: None)
    assert scheduler.alive()  # before the first cycle: counted from construction
    scheduler.start()
    try:
        assert entered.wait(5.0)
        clock.advance(LIVE_PERIODS * PERIOD_S)
        assert scheduler.alive()
        clock.advance(1.0)
        assert not scheduler.alive()
    finally:
        release.set()
        assert scheduler.stop(5.0)


def test_stop_returns_at_once_between_cycles() -> None:
    ran = threading.Event()
    scheduler = PeriodicScheduler(ran.set, 60.0, clock=SystemClock(), on_skipped=lambda _: None)
    scheduler.start()
    assert ran.wait(5.0)
    start = time.monotonic()
    assert scheduler.stop(5.0)
    assert time.monotonic() - start < 0.5


def test_stop_gives_up_on_a_stuck_cycle_after_its_timeout() -> None:
    entered, release = threading.Event(), threading.Event()

    def stuck() -> None:
        entered.set()
        release.wait(10.0)

    scheduler = PeriodicScheduler(stuck, 60.0, clock=SystemClock(), on_skipped=lambda _: None)
    scheduler.start()
    try:
        assert entered.wait(5.0)
        start = time.monotonic()
        assert not scheduler.stop(0.3)
        assert time.monotonic() - start < 1.0
    finally:
        release.set()


# -- the daemon process ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def silent_pod() -> Iterator[socket.socket]:
    """A listening socket that never accepts: the daemon's scrape connects and waits."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock


def healthz(port: int) -> int:
    try:
        with urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as resp:
            return int(resp.status)
    except (URLError, ConnectionError, TimeoutError):
        return 0


@pytest.mark.integration
def test_sigterm_ends_the_daemon_within_5_s_while_a_cycle_runs(
    silent_pod: socket.socket, tmp_path: Path
) -> None:
    """The cycle waits on a pod that never answers (its read may take 30 s, the cycle 24 s):
    SIGTERM must not wait for either."""
    port = free_port()
    config = tmp_path / "sizer.yaml"
    pod = f"http://127.0.0.1:{silent_pod.getsockname()[1]}/metrics"
    config.write_text(
        yaml.safe_dump(
            {
                "cycle_period_s": 30,
                "listen_address": f"127.0.0.1:{port}",
                "deployments": [
                    {
                        "name": "llama",
                        "model_name": "llama",
                        "source": {"scrape_urls": [pod], "scrape_timeout_s": 30},
                        "slo": {"ttft_ms": 50, "itl_ms": 25},
                        "replicas": {"min": 1, "max": 4},
                    }
                ],
            }
        )
    )
    log = tmp_path / "daemon.log"
    with log.open("wb") as out:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "exporter.cli.main", "run", "--config", str(config)],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while healthz(port) != 200:
            assert daemon.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        readable, _, _ = select.select([silent_pod], [], [], 10.0)
        assert readable, "the daemon's cycle never connected to the pod"
        time.sleep(0.5)  # the cycle is now waiting on its read
        start = time.monotonic()
        daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(timeout=5.0)
        assert code == 0, log.read_text()
        assert time.monotonic() - start < 5.0
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
