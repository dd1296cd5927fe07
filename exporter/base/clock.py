"""Injected time: the system clock in production, a manual clock in tests and compressed runs."""

from __future__ import annotations

import math
import time
from typing import Protocol


class Clock(Protocol):
    """Wall time for timestamps, monotonic time for durations (both in seconds)."""

    def time(self) -> float: ...  # unix s: timestamps, freshness

    def monotonic(self) -> float: ...  # s: durations, windows, stabilization


class SystemClock:
    """The real clock."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to; wall and monotonic time advance together unless the
    wall clock is stepped on its own."""

    def __init__(self, start_s: float = 1_700_000_000.0) -> None:
        self._wall_s = float(start_s)
        self._mono_s = 0.0

    def time(self) -> float:
        return self._wall_s

    def monotonic(self) -> float:
        return self._mono_s

    def advance(self, seconds: float) -> None:
        if not seconds >= 0:
            raise ValueError(f"`seconds` must be >= 0, got {seconds}")
        self._wall_s += seconds
        self._mono_s += seconds

    def step_wall(self, seconds: float) -> None:
        """Step the wall clock alone, either way, as NTP or an operator does to a real one;
        monotonic time does not move."""
        if not math.isfinite(seconds):
            raise ValueError(f"`seconds` must be finite, got {seconds}")
        self._wall_s += seconds
