"""Scale-down stabilization, as Kubernetes' HPA does it: the count recommended is the highest
count wanted within the last `window_s` seconds, so a fall is followed only once it has lasted
the whole window, and a rise at once. One deployment's recommender (exporter/sizing/
recommender.py) and each variant of a fleet plan (exporter/sizing/fleet/plan.py) hold one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


class ScaleDownWindow:
    """The counts wanted over the last `window_s` seconds (s, from the caller's clock)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._entries: deque[tuple[float, int]] = deque()

    def hold(self, now_s: float, wanted: int) -> int:
        """Record `wanted` at now_s and return the highest count wanted within the window
        (entries older than now_s - window_s are forgotten)."""
        while self._entries and self._entries[0][0] < now_s - self.window_s:
            self._entries.popleft()
        self._entries.append((now_s, wanted))
        return max(count for _, count in self._entries)

    def highest(self, now_s: float) -> int | None:
        """The highest count wanted within [now_s - window_s, now_s], without recording one;
        None when there is none."""
        recent = [c for t, c in self._entries if now_s - self.window_s <= t <= now_s]
        return max(recent) if recent else None

    def entries(self) -> list[tuple[float, int]]:
        """(time s, count) of every entry kept, oldest first."""
        return list(self._entries)

    def restore(
        self, entries: Iterable[tuple[float, int]], now_s: float, low: int, high: int
    ) -> None:
        """Replace the entries by those of `entries` within [now_s - window_s, now_s], each
        count clamped to [low, high] (today's bounds)."""
        self._entries.clear()
        for t, count in entries:
            if now_s - self.window_s <= t <= now_s:
                self._entries.append((t, min(max(count, low), high)))
