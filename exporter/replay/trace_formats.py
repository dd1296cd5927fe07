"""How a request trace's file is opened: CSV or JSON Lines, plain or gzip-compressed.

A file whose first bytes are gzip's is decompressed as it is read; bzip2, xz, zstd and zip are
refused with a message naming the compression (decompress them first). A file whose first
non-blank character is `{` is JSON Lines: one object a line, the shared trace's
`timestamp` (milliseconds from the start), `input_length` and `output_length`, or the keys
named by `--columns`; a numeric time in JSON Lines is read as milliseconds. Anything else is
CSV with a header row.

Both formats are handed to the reader as rows of three cells in the column order (time,
prompt, output) with the line number of the row, so bad rows are named alike; a JSON Lines
line that is not an object comes out as None (a bad row).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

GZIP_MAGIC = b"\x1f\x8b"
REFUSED_MAGIC = (
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"PK\x03\x04", "zip"),
)
JSONL_COLUMNS = ("timestamp", "input_length", "output_length")
MS_PER_S = 1000.0
MAX_LINE_CHARS = 1 << 17  # a trace line longer than this holds no three numbers
SNIFF_CHARS = 4096


class FormatError(ValueError):
    """A trace file that cannot be opened as a trace (the message names the file)."""


@dataclass(frozen=True, slots=True)
class Opened:
    """An opened trace: its text stream, whether it is JSON Lines, and whether gzip'd."""

    stream: TextIO
    jsonl: bool
    gzipped: bool


def open_trace(path: Path) -> Opened:
    """The file as text, its format sniffed (FormatError for a compression it cannot read)."""
    with path.open("rb") as fh:
        magic = fh.read(8)
    for prefix, name in REFUSED_MAGIC:
        if magic.startswith(prefix):
            raise FormatError(f"{path}: compressed with {name}; decompress it first (gzip is "
                              "read as it is)")
    gzipped = magic.startswith(GZIP_MAGIC)
    if gzipped:
        stream: TextIO = io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8",
                                          errors="replace", newline="")
    else:
        stream = path.open(newline="", encoding="utf-8", errors="replace")
    try:
        head = _sniff(stream, path)
    except BaseException:
        stream.close()
        raise
    return Opened(stream, head.lstrip("\ufeff \t\r\n").startswith("{"), gzipped)


def _sniff(stream: TextIO, path: Path) -> str:
    try:
        head = stream.read(SNIFF_CHARS)
        stream.seek(0)
    except (OSError, EOFError, zlib.error) as exc:
        raise FormatError(f"{path}: not a readable gzip file ({exc})") from None
    return head


class CsvRows:
    """The CSV rows of a stream; `line_num` is the last row's line."""

    def __init__(self, stream: TextIO) -> None:
        self._reader = csv.reader(stream)

    @property
    def line_num(self) -> int:
        return self._reader.line_num

    def __iter__(self) -> Iterator[list[str]]:
        return iter(self._reader)


class JsonRows:
    """The objects of a JSON Lines stream as [time, prompt, output] cells (None: not an
    object with those keys); `line_num` is the last line read."""

    def __init__(self, stream: TextIO, names: tuple[str, str, str]) -> None:
        self._stream = stream
        self._names = names
        self.line_num = 0

    def __iter__(self) -> Iterator[list[str] | None]:
        for line in self._stream:
            self.line_num += 1
            if not line.strip():
                continue
            if len(line) > MAX_LINE_CHARS:
                yield None
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                yield None
                continue
            if not isinstance(obj, dict):
                yield None
                continue
            yield [_cell(obj.get(name), time=k == 0) for k, name in enumerate(self._names)]


def _cell(value: object, *, time: bool) -> str:
    if value is None or isinstance(value, bool | dict | list):
        return ""
    if time and isinstance(value, int | float):
        return repr(float(value) / MS_PER_S)
    return str(value)


def read_failure(path: Path, exc: BaseException) -> FormatError:
    """A read that failed part way (a truncated gzip, a CSV field over the csv module's
    limit) as a FormatError naming the file."""
    if isinstance(exc, csv.Error):
        return FormatError(f"{path}: {exc} (a cell longer than {MAX_LINE_CHARS} characters is "
                           "not a trace value)")
    return FormatError(f"{path}: the file ends early or is corrupt ({exc})")


READ_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile, csv.Error)
