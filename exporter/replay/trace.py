"""Arrivals for a replay: a request trace streamed from CSV or JSON Lines (plain or gzip).

Request trace: one row per request, with an arrival time, prompt tokens and output tokens in
named columns. Known headers are found by themselves: the public Azure LLM inference trace
(`TIMESTAMP,ContextTokens,GeneratedTokens`) and `simulate --trace`'s
(`arrival_s,input_tokens,output_tokens`); JSON Lines in the shared trace's keys (`timestamp`
in ms, `input_length`, `output_length`, exporter/replay/trace_formats.py); any other names are
given as `TraceColumns`. A CSV time is seconds (any origin: unix time, or from the start) or an
ISO 8601 date-time; the replay's t = 0 is the first row's time. Rows must come in arrival order.
The file is read row by row as the replay advances, never whole. A trace without a good row, or
a window holding none of its rows, is a `TraceError`.

A malformed row (a missing or non-numeric value, tokens < 1, a time before the previous row's)
stops the replay with a `TraceError` naming the row, the line and the column; with
`skip_bad_rows` it is skipped and counted (`bad_rows`).

Transforms, applied in this order: `spread_s` spreads each group of rows with one time over the
following `spread_s` seconds (uniformly, at most up to the next group's time): a trace whose
times are quantized (the shared trace's 3 s) otherwise arrives in bursts it never had;
`window` keeps the arrivals in [start, end) seconds after the trace's first row; `speed`
divides times by a factor (2: twice as fast, so twice the rate); `rate_scale` thins (< 1: each
request kept with that probability) or multiplies (> 1: floor(k) copies of each request plus
one more with probability frac(k); the added copies arrive uniformly between the request and
the next one, keeping the trace's rate profile, its lengths and its burstiness;
exporter/replay/scaling.py scales like more independent users instead). All randomness comes
from the given generator: same seed, same arrivals.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

import numpy as np

from exporter.replay.trace_formats import (
    JSONL_COLUMNS,
    MS_PER_S,
    READ_ERRORS,
    CsvRows,
    FormatError,
    JsonRows,
    open_trace,
    read_failure,
)
from model.simulation.workloads import RequestTrace

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
SIMULATE_COLUMNS = ("arrival_s", "input_tokens", "output_tokens")
KNOWN_COLUMNS = (AZURE_COLUMNS, SIMULATE_COLUMNS, JSONL_COLUMNS)
MAX_TRACE_TOKENS = 1 << 24  # one request's prompt or output: beyond any context length
MAX_FIELD_CHARS = 1024  # a cell longer than this is not a number or a date
TAIL_BYTES = 4096  # enough for a last row
# Longer is a time in another unit or a corrupt row: idle stretches cost nothing (the engine
# skips them), but a busy year already takes days to replay.
MAX_SPAN_S = 366 * 86400.0


class TraceError(ValueError):
    """A trace that cannot be replayed; the message names the file, row and column."""


Row = tuple[float, int, int]  # (s, prompt tokens, output tokens)


@dataclass(frozen=True, slots=True)
class TraceColumns:
    """The names of a request trace's three columns."""

    time: str
    prompt_tokens: str
    output_tokens: str

    @classmethod
    def parse(cls, text: str) -> TraceColumns:
        """TIME,PROMPT,OUTPUT column names (ValueError otherwise)."""
        names = [n.strip() for n in text.split(",")]
        if len(names) != 3 or not all(names):
            raise ValueError(f"must be three column names TIME,PROMPT,OUTPUT, got {text!r}")
        return cls(*names)


@dataclass(frozen=True, slots=True)
class Transform:
    """What the replay does to the trace's arrivals (see the module docstring)."""

    speed: float = 1.0
    rate_scale: float = 1.0
    window_start_s: float = 0.0
    window_end_s: float = math.inf
    spread_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("speed", "rate_scale"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"`{name}` must be a number > 0, got {value}")
        if not (math.isfinite(self.spread_s) and self.spread_s >= 0):
            raise ValueError(f"`spread_s` must be a number >= 0, got {self.spread_s}")
        if not (0 <= self.window_start_s < self.window_end_s):
            raise ValueError(
                f"the window must satisfy 0 <= start < end, got {self.window_start_s}, "
                f"{self.window_end_s}"
            )


def parse_time(text: str) -> float:
    """Seconds from a number or an ISO 8601 date-time (naive ones read as UTC); the Azure
    trace's seven fractional digits are read to the microsecond."""
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        value = _iso_seconds(text)
    if not math.isfinite(value):
        raise ValueError("not a finite time")
    return value


def _iso_seconds(text: str) -> float:
    head, dot, tail = text.partition(".")
    if dot:  # a 7th digit (100 ns) is below a unix time's float resolution anyway
        digits = len(tail) - len(tail.lstrip("0123456789"))
        tail = tail[: min(digits, 6)] + tail[digits:]
    stamp = datetime.fromisoformat(head + dot + tail)
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()


class TraceReader:
    """Streams a request-trace CSV as an engine `ArrivalSource`."""

    def __init__(
        self,
        path: Path,
        *,
        rng: np.random.Generator,
        columns: TraceColumns | None = None,
        transform: Transform | None = None,
        skip_bad_rows: bool = False,
    ) -> None:
        self.path = path
        self._rng = rng
        self._transform = transform or Transform()
        self._skip = skip_bad_rows
        self.bad_rows = 0
        self.rows = 0  # data rows read so far
        try:
            opened = open_trace(path)
        except FormatError as exc:
            raise TraceError(str(exc)) from None
        self._fh: TextIO = opened.stream
        self.jsonl, self.gzipped = opened.jsonl, opened.gzipped
        self._reader: CsvRows | JsonRows
        try:
            if self.jsonl:
                self.columns = columns or TraceColumns(*JSONL_COLUMNS)
                self._index: tuple[int, ...] = (0, 1, 2)
                self._reader = JsonRows(self._fh, (self.columns.time, self.columns.prompt_tokens,
                                                   self.columns.output_tokens))
            else:
                self._reader = CsvRows(self._fh)
                first = next((r for r in self._reader if any(c.strip() for c in r)), None)
                if first is None:
                    raise TraceError(f"{path}: empty file: no header and no request rows to "
                                     "replay")
                header = [h.strip().lstrip("\ufeff") for h in first]  # spreadsheets write a BOM
                self.columns = columns or _known(header, path)
                self._index = _column_indexes(header, self.columns, path)
        except BaseException:
            self._fh.close()
            raise
        self._origin_s: float | None = None
        self._last_s = -math.inf
        self._last_since_s = 0.0  # the last good row read, s after the first
        self._rows = self._parsed()
        self._next: Row | None = None  # the first row not yet returned
        self._held: list[Row] = []  # copies due after the last end
        self._ended = False
        self._last_count = 0
        try:
            self._advance()
            if self._next is None:
                raise self._nothing_to_replay()
        except TraceError:
            self._fh.close()
            raise

    def _nothing_to_replay(self) -> TraceError:
        t = self._transform
        if self._origin_s is None:
            bad = f" ({self.bad_rows} malformed rows skipped)" if self.bad_rows else ""
            return TraceError(f"{self.path}: no request rows to replay{bad}")
        return TraceError(
            f"{self.path}: the window [{t.window_start_s:g}, {t.window_end_s:g}) s holds no row; "
            f"the trace's rows read span 0-{self._last_since_s:g} s after its first"
        )

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> TraceReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def span_s(self) -> float | None:
        """The replay's length from the first row's time to the last line's, after the window
        and speed (None when the last line is not a good row): for a progress bar."""
        if self._origin_s is None or self.gzipped:
            return None
        with self.path.open("rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - TAIL_BYTES))
            lines = [x for x in fh.read().split(b"\n") if x.strip()]
        try:
            last = lines[-1].decode("utf-8", errors="replace")
            if self.jsonl:
                last_s = float(json.loads(last)[self.columns.time]) / MS_PER_S - self._origin_s
            else:
                cells = next(csv.reader([last]))
                last_s = parse_time(cells[self._index[0]]) - self._origin_s
        except (IndexError, ValueError, KeyError, TypeError):
            return None
        t = self._transform
        end_s = min(last_s, t.window_end_s)
        return max(end_s - t.window_start_s, 0.0) / t.speed

    @property
    def exhausted(self) -> bool:
        return self._ended and self._next is None and not self._held

    def offered_rps(self, start_s: float, end_s: float) -> float:
        """The arrivals the last `until` returned, over the window."""
        return self._last_count / (end_s - start_s)

    def next_arrival_s(self) -> float | None:
        """The earliest arrival not yet returned (copies of a row follow the row)."""
        times = [r[0] for r in self._held]
        if self._next is not None:
            times.append(self._next[0])
        return min(times, default=None)

    def until(self, end_s: float) -> RequestTrace:
        rows = [r for r in self._held if r[0] <= end_s]
        self._held = [r for r in self._held if r[0] > end_s]
        while self._next is not None and self._next[0] <= end_s:
            current = self._next
            self._advance()
            following = None if self._next is None else self._next[0]
            for copy in self._copies(current, following):
                (rows if copy[0] <= end_s else self._held).append(copy)
        rows.sort(key=lambda r: r[0])
        self._last_count = len(rows)
        return RequestTrace(
            np.array([r[0] for r in rows], dtype=np.float64),
            np.array([r[1] for r in rows], dtype=np.int64),
            np.array([r[2] for r in rows], dtype=np.int64),
        )

    def _copies(self, row: Row, following_s: float | None) -> Iterator[Row]:
        k = self._transform.rate_scale
        if k == 1.0:
            yield row
            return
        whole = math.floor(k)
        count = whole + int(self._rng.random() < k - whole)
        if count == 0:
            return
        yield row
        gap = 0.0 if following_s is None else following_s - row[0]
        for offset in self._rng.random(count - 1) * gap:
            yield (row[0] + float(offset), row[1], row[2])

    def _advance(self) -> None:
        try:
            self._next = next(self._rows, None)
        except TraceError:
            self._fh.close()  # the replay stops here: nothing more will be read
            raise
        if self._next is None:
            self._ended = True
            self._fh.close()  # read to the end (or past the window): nothing more to read

    def _parsed(self) -> Iterator[Row]:
        """(replay time s, prompt, output) of each good row inside the window, in order."""
        t = self._transform
        rows = self._good() if t.spread_s == 0 else self._spread(self._good(), t.spread_s)
        for since_s, prompt, output in rows:
            if since_s < t.window_start_s:
                continue
            if since_s >= t.window_end_s:
                self._ended = True
                return
            yield ((since_s - t.window_start_s) / t.speed, prompt, output)

    def _good(self) -> Iterator[Row]:
        """(s after the first row, prompt, output) of each good row."""
        cells_of = iter(self._reader)
        while True:
            try:
                cells = next(cells_of, ())
            except READ_ERRORS as exc:
                raise TraceError(str(read_failure(self.path, exc))) from None
            if cells == ():
                return
            if cells is not None and (not cells or all(not c.strip() for c in cells)):
                continue  # blank line
            self.rows += 1
            try:
                if cells is None:
                    raise TraceError(f"{self.path}: row {self.rows} (line "
                                     f"{self._reader.line_num}): not a JSON object")
                raw_s, prompt, output = self._row(cells)
            except TraceError:
                if not self._skip:
                    raise
                self.bad_rows += 1
                continue
            if self._origin_s is None:
                self._origin_s = raw_s
            if raw_s - self._origin_s > MAX_SPAN_S:
                raise TraceError(
                    f"{self.path}: row {self.rows} (line {self._reader.line_num}) comes "
                    f"{raw_s - self._origin_s:.3g} s after the first row, beyond the longest "
                    f"replay ({MAX_SPAN_S / 86400:g} days): a time in another unit or a "
                    "corrupt row?")
            self._last_since_s = raw_s - self._origin_s
            yield (raw_s - self._origin_s, prompt, output)

    def _spread(self, rows: Iterable[Row], spread_s: float) -> Iterator[Row]:
        group: list[Row] = []
        for row in rows:
            if group and row[0] != group[0][0]:
                yield from self._spread_group(group, min(spread_s, row[0] - group[0][0]))
                group = []
            group.append(row)
        if group:
            yield from self._spread_group(group, spread_s)

    def _spread_group(self, group: list[Row], span_s: float) -> list[Row]:
        offsets = np.sort(self._rng.random(len(group))) * span_s
        return [(r[0] + float(dt), r[1], r[2]) for r, dt in zip(group, offsets, strict=True)]

    def _row(self, cells: list[str]) -> tuple[float, int, int]:
        where = f"{self.path}: row {self.rows} (line {self._reader.line_num})"
        values = []
        names = (self.columns.time, self.columns.prompt_tokens, self.columns.output_tokens)
        for name, column in zip(names, self._index, strict=True):
            if column >= len(cells) or not cells[column].strip():
                raise TraceError(f"{where}, column {name!r}: missing value")
            text = cells[column]
            if len(text) > MAX_FIELD_CHARS:
                raise TraceError(
                    f"{where}, column {name!r}: longer than {MAX_FIELD_CHARS} characters"
                )
            values.append((name, text))
        (time_name, time_text), (p_name, p_text), (o_name, o_text) = values
        try:
            raw_s = parse_time(time_text)
        except ValueError:
            raise TraceError(
                f"{where}, column {time_name!r}: must be seconds or an ISO 8601 date-time, "
                f"got {time_text.strip()[:40]!r}"
            ) from None
        if raw_s < self._last_s:
            raise TraceError(
                f"{where}, column {time_name!r}: before the previous row's time "
                f"(rows must be in arrival order), got {time_text.strip()[:40]!r}"
            )
        prompt = _tokens(p_text, f"{where}, column {p_name!r}")
        output = _tokens(o_text, f"{where}, column {o_name!r}")
        self._last_s = raw_s
        return raw_s, prompt, output


def _tokens(text: str, where: str) -> int:
    try:
        value = float(text.strip())
    except ValueError:
        value = math.nan
    if not (value.is_integer() and 1 <= value <= MAX_TRACE_TOKENS):
        raise TraceError(
            f"{where}: must be an integer >= 1 and <= {MAX_TRACE_TOKENS}, got "
            f"{text.strip()[:40]!r}"
        )
    return int(value)


def _known(header: list[str], path: Path) -> TraceColumns:
    for known in KNOWN_COLUMNS:
        if all(k in header for k in known):
            return TraceColumns(*known)
    raise TraceError(
        f"{path}: header {','.join(header)[:120]!r} has neither "
        f"{','.join(AZURE_COLUMNS)} nor {','.join(SIMULATE_COLUMNS)}; name the columns with "
        "--columns TIME,PROMPT,OUTPUT"
    )


def _column_indexes(header: list[str], columns: TraceColumns, path: Path) -> tuple[int, ...]:
    out = []
    for name in (columns.time, columns.prompt_tokens, columns.output_tokens):
        if name not in header:
            raise TraceError(f"{path}: no column {name!r} in the header ({','.join(header)[:120]})")
        out.append(header.index(name))
    return tuple(out)
