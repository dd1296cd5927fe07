"""Arrival sources besides a request trace (exporter/replay/trace.py): requests drawn before the
replay (the closed-loop bench's, the tests'), and a rate profile from CSV with length laws, for
those who only have Prometheus rates (`sum(rate(vllm:request_success_total[1m]))` exported as
time,rate rows).

A rate profile is piecewise linear between its rows; the replay's t = 0 is its first row. The
same `Transform` as for a trace applies: the window cuts it (interpolating at the edges), speed
divides its times (and multiplies its rates), rate_scale multiplies its rates. Arrivals are a
renewal process on it (Poisson by default) drawn window by window, so a week-long profile is
never drawn at once; lengths come from the two laws or from recorded pairs.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from exporter.replay.trace import MAX_FIELD_CHARS, TraceError, Transform, parse_time
from model.simulation.workloads import (
    ArrivalStream,
    LengthDist,
    LengthPairs,
    RateProfile,
    RateSegment,
    RequestTrace,
)

PROFILE_TIME_COLUMNS = ("time", "timestamp")
PROFILE_RATE_COLUMNS = ("rate", "rate_rps", "value")
MAX_PROFILE_ROWS = 10_000_000


class DrawnArrivals:
    """Requests drawn beforehand, handed out window by window; the offered load is `rate_at`
    the window's middle when given (a known profile), else the arrivals over the window."""

    def __init__(
        self,
        trace: RequestTrace,
        rate_at: Callable[[float], float] | None = None,
        *,
        rows: int | None = None,
    ) -> None:
        self.rows = rows  # the trace rows the requests were made from, when read from a file
        self._trace = trace
        self._rate_at = rate_at
        self._cursor = 0
        self._last_count = 0

    @property
    def exhausted(self) -> bool:
        return self._cursor >= len(self._trace)

    def until(self, end_s: float) -> RequestTrace:
        t = self._trace
        stop = int(np.searchsorted(t.arrival_s, end_s, side="right"))
        rows = slice(self._cursor, max(stop, self._cursor))
        self._cursor = rows.stop
        self._last_count = rows.stop - rows.start
        cached = None if t.cached_tokens is None else t.cached_tokens[rows]
        return RequestTrace(t.arrival_s[rows], t.input_tokens[rows], t.output_tokens[rows], cached)

    def next_arrival_s(self) -> float | None:
        if self.exhausted:
            return None
        return float(self._trace.arrival_s[self._cursor])

    def offered_rps(self, start_s: float, end_s: float) -> float:
        if self._rate_at is not None:
            return float(self._rate_at(start_s + (end_s - start_s) / 2))
        return self._last_count / (end_s - start_s)


class ProfileArrivals:
    """Arrivals on a rate profile, drawn as the replay advances; it ends with the profile."""

    def __init__(
        self,
        profile: RateProfile,
        rng: np.random.Generator,
        *,
        input_lengths: LengthDist,
        output_lengths: LengthDist,
        pairs: LengthPairs | None = None,
        interarrival_cv: float = 1.0,
    ) -> None:
        self.profile = profile
        self._rng = rng
        self._in, self._out, self._pairs = input_lengths, output_lengths, pairs
        self._stream = ArrivalStream(profile, rng, cv=interarrival_cv)
        self._drawn_to = 0.0

    @property
    def exhausted(self) -> bool:
        return self._drawn_to >= self.profile.duration_s

    def until(self, end_s: float) -> RequestTrace:
        end_s = min(end_s, self.profile.duration_s)
        if end_s <= self._drawn_to:
            return RequestTrace(np.empty(0), np.empty(0, np.int64), np.empty(0, np.int64))
        times = self._stream.draw_until(end_s)
        self._drawn_to = end_s
        if self._pairs is None:
            n_in = self._in.sample(times.size, self._rng)
            n_out = self._out.sample(times.size, self._rng)
        else:
            n_in, n_out = self._pairs.sample(times.size, self._rng)
        return RequestTrace(times, n_in, n_out)

    def next_arrival_s(self) -> float | None:
        """Not known before it is drawn: a profile's idle stretches are stepped through."""
        return None

    def offered_rps(self, start_s: float, end_s: float) -> float:
        area = self.profile.cumulative(np.array([start_s, end_s]))
        return float(area[1] - area[0]) / (end_s - start_s)


def load_rate_profile(
    path: Path,
    *,
    transform: Transform | None = None,
    columns: tuple[str, str] | None = None,
    skip_bad_rows: bool = False,
) -> tuple[RateProfile, int]:
    """The profile in a time,rate CSV (req/s, times in seconds or ISO 8601, in order) and the
    number of bad rows skipped; TraceError names the row and column of a bad one."""
    t = transform or Transform()
    times: list[float] = []
    rates: list[float] = []
    skipped = 0
    with path.open(newline="", encoding="utf-8", errors="replace") as fh:
        reader = csv.reader(fh)
        header = [h.strip() for h in next(reader, [])]
        time_col, rate_col = columns or (
            _first(header, PROFILE_TIME_COLUMNS, path), _first(header, PROFILE_RATE_COLUMNS, path)
        )
        for name in (time_col, rate_col):
            if name not in header:
                raise TraceError(f"{path}: no column {name!r} in the header ({','.join(header)})")
        ti, ri = header.index(time_col), header.index(rate_col)
        row = 0
        for cells in reader:
            if not cells or all(not c.strip() for c in cells):
                continue
            row += 1
            if row > MAX_PROFILE_ROWS:
                raise TraceError(f"{path}: more than {MAX_PROFILE_ROWS} rows")
            try:
                when, rate = _profile_row(cells, ti, ri, (time_col, rate_col),
                                          times[-1] if times else -math.inf,
                                          f"{path}: row {row} (line {reader.line_num})")
            except TraceError:
                if not skip_bad_rows:
                    raise
                skipped += 1
                continue
            times.append(when)
            rates.append(rate)
    if len(times) < 2:
        raise TraceError(f"{path}: a rate profile needs at least two good rows, got {len(times)}")
    return _windowed(np.array(times) - times[0], np.array(rates), t, path), skipped


def _profile_row(
    cells: list[str], ti: int, ri: int, names: tuple[str, str], previous_s: float, where: str
) -> tuple[float, float]:
    values = []
    for index, name in zip((ti, ri), names, strict=True):
        if index >= len(cells) or not cells[index].strip():
            raise TraceError(f"{where}, column {name!r}: missing value")
        if len(cells[index]) > MAX_FIELD_CHARS:
            raise TraceError(f"{where}, column {name!r}: longer than {MAX_FIELD_CHARS} characters")
        values.append(cells[index].strip())
    try:
        when = parse_time(values[0])
    except ValueError:
        raise TraceError(f"{where}, column {names[0]!r}: must be seconds or an ISO 8601 "
                         f"date-time, got {values[0][:40]!r}") from None
    if when <= previous_s:
        raise TraceError(f"{where}, column {names[0]!r}: not after the previous row's time, "
                         f"got {values[0][:40]!r}")
    try:
        rate = float(values[1])
    except ValueError:
        rate = math.nan
    if not (math.isfinite(rate) and rate >= 0):
        raise TraceError(f"{where}, column {names[1]!r}: must be a rate >= 0 (req/s), "
                         f"got {values[1][:40]!r}")
    return when, rate


def _windowed(times: np.ndarray, rates: np.ndarray, t: Transform, path: Path) -> RateProfile:
    start, end = t.window_start_s, min(t.window_end_s, float(times[-1]))
    if not start < end:
        raise TraceError(f"{path}: the window [{start:g}, {t.window_end_s:g}) s holds no part "
                         f"of the profile (it spans 0-{times[-1]:g} s)")
    grid = np.unique(np.concatenate(([start], times[(times > start) & (times < end)], [end])))
    values = np.interp(grid, times, rates) * t.rate_scale * t.speed
    starts = (grid - start) / t.speed
    return RateProfile(tuple(
        RateSegment(float(starts[k + 1] - starts[k]), float(values[k]), float(values[k + 1]))
        for k in range(grid.size - 1)
    ))


def _first(header: list[str], names: tuple[str, ...], path: Path) -> str:
    found = next((n for n in names if n in header), None)
    if found is None:
        raise TraceError(f"{path}: header {','.join(header)[:120]!r} has none of "
                         f"{', '.join(names)}; name the columns with --columns TIME,RATE")
    return found
