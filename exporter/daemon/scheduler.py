"""Runs the daemon's cycle every period on the monotonic clock, one cycle at a time.

Not APScheduler's interval trigger: it computes each run time on the wall clock and sleeps
until it, so a backward step of the system clock (NTP, a VM restored from a snapshot) holds
every cycle back by the size of the step: an hour's step stopped the sizer's cycles while
/healthz stayed 200. This loop never reads the wall clock: period boundaries are monotonic
times, and a cycle that overruns its period is followed by one at the next boundary, the
boundaries passed meanwhile being counted instead of run back to back.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable

from exporter.base.clock import Clock
from exporter.daemon.log_lines import log_unexpected

logger = logging.getLogger(__name__)

# Alive while a cycle started within this many periods: a cycle stuck for longer, or a loop
# that died, fails the liveness probe (/healthz) so the pod is restarted.
LIVE_PERIODS = 3.0

# Waits up to `timeout_s` seconds for `event`; returns whether it is set. threading.Event.wait
# in production; a test's version advances a fake clock instead of sleeping.
Wait = Callable[[threading.Event, float], bool]


def _event_wait(event: threading.Event, timeout_s: float) -> bool:
    return event.wait(timeout_s)


def next_start(scheduled_s: float, now_s: float, period_s: float) -> tuple[float, int]:
    """After the cycle due at `scheduled_s` ends at `now_s`: the first boundary
    `scheduled_s + k * period_s` (k >= 1) not before `now_s`, and how many boundaries (k - 1)
    were passed without a cycle."""
    periods = max(1, math.ceil((now_s - scheduled_s) / period_s))
    return scheduled_s + periods * period_s, periods - 1


class PeriodicScheduler:
    """Calls `job()` every `period_s` seconds of `clock.monotonic()` on its own thread, the first
    call at once; `on_skipped(n)` hears of the n boundaries an overrunning call passed."""

    def __init__(
        self,
        job: Callable[[], object],
        period_s: float,
        *,
        clock: Clock,
        on_skipped: Callable[[int], None],
        wait: Wait = _event_wait,
    ) -> None:
        if not (math.isfinite(period_s) and period_s > 0):
            raise ValueError(f"`period_s` must be a finite number > 0, got {period_s}")
        self._job = job
        self._period_s = period_s
        self._clock = clock
        self._on_skipped = on_skipped
        self._wait = wait
        self._stopping = threading.Event()
        # A daemon thread: a cycle stuck past stop()'s timeout must not hold up the exit.
        self._thread = threading.Thread(target=self._loop, name="vllm-sizer-cycle", daemon=True)
        # The last cycle's start; until the first, construction, which gives the first cycle
        # the same LIVE_PERIODS to start as any other.
        self._last_start_s = clock.monotonic()

    def alive(self) -> bool:
        """True while a cycle started within the last LIVE_PERIODS periods."""
        return self._clock.monotonic() - self._last_start_s <= LIVE_PERIODS * self._period_s

    def start(self) -> None:
        # The first cycle's LIVE_PERIODS count from here: what ran between construction and
        # start (the daemon compiles the model's kernel) is no cycle overdue.
        self._last_start_s = self._clock.monotonic()
        self._thread.start()

    def stop(self, timeout_s: float) -> bool:
        """Start no more cycles and wait at most `timeout_s` for a running one to end; False if
        it is still running."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _loop(self) -> None:
        scheduled_s = self._clock.monotonic()
        while True:
            delay_s = scheduled_s - self._clock.monotonic()
            if delay_s > 0:
                if self._wait(self._stopping, delay_s):
                    return
                continue  # woken before the boundary: wait for the rest
            if self._stopping.is_set():
                return
            self._last_start_s = self._clock.monotonic()
            try:
                self._job()
            except Exception as exc:  # one failed cycle must not end the schedule
                log_unexpected(logger, "cycle raised", exc)
            scheduled_s, skipped = next_start(scheduled_s, self._clock.monotonic(), self._period_s)
            if skipped:
                self._on_skipped(skipped)
