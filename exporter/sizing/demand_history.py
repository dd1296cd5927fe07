"""A deployment's arrival rate over the last seasons, downsampled, for the forecasters
(exporter.sizing.forecasters): the recent windows as read, and the mean rate of each bucket
(5 minutes of a day by default) over HW_SEASONS seasons. Kept in the state file, so a restart
does not forget the day (exporter/daemon/deployment_state.py)."""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from exporter.sizing.forecasters import HW_SEASONS, KALMAN_WINDOWS, Series

DAY_S = 86400.0
BUCKETS_PER_SEASON = 288  # 5-minute buckets of a day
# No rate above this is history (a restored state's or a counter's glitch would size for it).
MAX_RATE_RPS = 1e6


class DemandHistory:
    """Rates read, by cycle time: the last KALMAN_WINDOWS windows, and bucket means over the
    last HW_SEASONS seasons (plus the bucket being filled)."""

    def __init__(self, season_s: float = DAY_S, bucket_s: float | None = None) -> None:
        if not (math.isfinite(season_s) and season_s > 0):
            raise ValueError(f"`season_s` must be a number > 0, got {season_s}")
        self.season_s = season_s
        self.bucket_s = bucket_s if bucket_s is not None else season_s / BUCKETS_PER_SEASON
        if not (math.isfinite(self.bucket_s) and 0 < self.bucket_s <= season_s):
            raise ValueError(f"`bucket_s` must be > 0 and <= season_s, got {self.bucket_s}")
        self.recent: deque[tuple[float, float]] = deque(maxlen=KALMAN_WINDOWS)
        self._buckets: dict[int, tuple[float, int]] = {}  # index -> (sum of rates, windows)

    @property
    def kept_buckets(self) -> int:
        return HW_SEASONS * round(self.season_s / self.bucket_s) + 1

    def add(self, now_s: float, rate_rps: float) -> None:
        """A window's rate read at cycle time `now_s` (s); a non-finite or negative rate, or
        a time before the last one, is not history."""
        if not (math.isfinite(now_s) and math.isfinite(rate_rps) and 0 <= rate_rps <= MAX_RATE_RPS):
            return
        if self.recent and now_s <= self.recent[-1][0]:
            return
        self.recent.append((now_s, rate_rps))
        index = math.floor(now_s / self.bucket_s)
        total, count = self._buckets.get(index, (0.0, 0))
        self._buckets[index] = (total + rate_rps, count + 1)
        for old in [i for i in self._buckets if i <= index - self.kept_buckets]:
            del self._buckets[old]

    def series(self) -> Series:
        """The forecasters' view: recent windows, and the complete buckets' means."""
        if not self.recent:
            return Series(recent=(), bucket_s=self.bucket_s, season_s=self.season_s)
        current = math.floor(self.recent[-1][0] / self.bucket_s)
        done = [i for i in self._buckets if i < current]
        if not done:
            return Series(recent=tuple(self.recent), start_s=current * self.bucket_s,
                          bucket_s=self.bucket_s, season_s=self.season_s)  # fmt: skip
        first = min(done)
        means: list[float | None] = []
        for i in range(first, current):
            entry = self._buckets.get(i)
            means.append(None if entry is None else entry[0] / entry[1])
        return Series(
            recent=tuple(self.recent), buckets=tuple(means), start_s=first * self.bucket_s,
            bucket_s=self.bucket_s, season_s=self.season_s,
        )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: the bucket size, the buckets (index, sum, windows) and recent windows."""
        return {
            "bucket_s": self.bucket_s,
            "buckets": [[i, total, count] for i, (total, count) in sorted(self._buckets.items())],
            "recent": [[t, r] for t, r in self.recent],
        }

    def restore(self, data: Any, now_s: float) -> None:
        """Load what `to_dict` saved, at time `now_s` (s): entries that do not parse, lie in
        the future or are older than the kept seasons are dropped; a different bucket size
        drops the buckets (their means would mix two grids)."""
        if not isinstance(data, dict):
            return
        oldest = math.floor(now_s / self.bucket_s) - self.kept_buckets
        buckets = data.get("buckets") if data.get("bucket_s") == self.bucket_s else None
        for entry in buckets if isinstance(buckets, list) else []:
            if not (isinstance(entry, list) and len(entry) == 3):
                continue
            index, total, count = entry
            if (
                isinstance(index, int) and isinstance(count, int) and 0 < count < MAX_COUNT
                and _number(total) and 0 <= total <= MAX_RATE_RPS * count
                and oldest < index <= math.floor(now_s / self.bucket_s)
            ):  # fmt: skip
                self._buckets[index] = (float(total), count)
        recent = data.get("recent")
        for entry in recent if isinstance(recent, list) else []:
            if (
                isinstance(entry, list) and len(entry) == 2
                and all(_number(v) for v in entry)
                and 0 <= entry[1] <= MAX_RATE_RPS and entry[0] <= now_s
                and (not self.recent or entry[0] > self.recent[-1][0])
            ):  # fmt: skip
                self.recent.append((float(entry[0]), float(entry[1])))


# A bucket holds at most this many windows (a day of 1-s cycles): a larger count is no state.
MAX_COUNT = 86400


def _number(value: Any) -> bool:
    """A finite int or float that converts to a float (a huge int does not)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False
