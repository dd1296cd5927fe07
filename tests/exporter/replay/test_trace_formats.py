"""Trace files beyond plain CSV: JSON Lines in the shared trace's keys, gzip, refused
compressions, quantized times spread, and the traces with nothing to replay."""

from __future__ import annotations

import bz2
import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from exporter.cli.main import main
from exporter.replay.trace import TraceColumns, TraceError, TraceReader, Transform
from tests.conftest import DATA_DIR

ROWS = [(0, 6758, 500), (0, 7322, 490), (3000, 7236, 794), (6000, 100, 20)]


def _jsonl(rows: list[tuple[int, int, int]] = ROWS) -> str:
    return "".join(json.dumps({"timestamp": t, "input_length": i, "output_length": o,
                               "hash_ids": [0, 1]}) + "\n" for t, i, o in rows)


def _read(path: Path, **kw: object) -> tuple[list[float], list[int], list[int]]:
    reader = TraceReader(path, rng=np.random.default_rng(0), **kw)  # type: ignore[arg-type]
    chunk = reader.until(1e9)
    reader.close()
    return chunk.arrival_s.tolist(), chunk.input_tokens.tolist(), chunk.output_tokens.tolist()


def test_jsonl_times_are_milliseconds_and_lengths_its_keys(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(_jsonl())
    times, prompts, outputs = _read(path)
    assert times == [0.0, 0.0, 3.0, 6.0]
    assert prompts == [6758, 7322, 7236, 100] and outputs == [500, 490, 794, 20]
    with TraceReader(path, rng=np.random.default_rng(0)) as reader:
        assert reader.columns == TraceColumns("timestamp", "input_length", "output_length")
        assert reader.span_s() == 6.0


def test_gzip_is_read_as_the_plain_file_and_other_compressions_refused(tmp_path: Path) -> None:
    plain, packed = tmp_path / "t.jsonl", tmp_path / "t.jsonl.gz"
    plain.write_text(_jsonl())
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert _read(packed) == _read(plain)
    csv_gz = tmp_path / "t.csv.gz"
    csv_gz.write_bytes(gzip.compress(b"arrival_s,input_tokens,output_tokens\n0,5,6\n2,7,8\n"))
    assert _read(csv_gz) == ([0.0, 2.0], [5, 7], [6, 8])
    truncated = tmp_path / "cut.jsonl.gz"
    many = [(k * 100, 10, 10) for k in range(2000)]
    truncated.write_bytes(gzip.compress(_jsonl(many).encode())[:300])
    with pytest.raises(TraceError, match="ends early or is corrupt"):
        _read(truncated)
    bz = tmp_path / "t.jsonl.bz2"
    bz.write_bytes(bz2.compress(plain.read_bytes()))
    with pytest.raises(TraceError, match="compressed with bzip2; decompress it first"):
        _read(bz)


def test_bad_jsonl_lines_are_named_or_skipped(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(_jsonl(ROWS[:2]) + "[1, 2]\n" + _jsonl(ROWS[2:]))
    with pytest.raises(TraceError, match=r"row 3 \(line 3\): not a JSON object"):
        _read(path)
    with TraceReader(path, rng=np.random.default_rng(0), skip_bad_rows=True) as reader:
        assert len(reader.until(1e9)) == 4 and reader.bad_rows == 1


def test_quantized_times_spread_over_their_group_in_order(tmp_path: Path) -> None:
    rows = [(3000 * (k // 10), 10, 10) for k in range(100)]  # ten groups of ten, 3 s apart
    path = tmp_path / "q.jsonl"
    path.write_text(_jsonl(rows))
    times = np.array(_read(path, transform=Transform(spread_s=3.0))[0])
    assert np.all(np.diff(times) >= 0)
    groups = np.repeat(np.arange(10) * 3.0, 10)
    assert np.all((times >= groups) & (times < groups + 3.0))
    assert np.unique(times).size == 100  # no two arrivals at one instant any more
    # A group is spread no further than the next group's time.
    path.write_text(_jsonl([(0, 1, 1), (0, 1, 1), (1000, 1, 1)]))
    assert max(_read(path, transform=Transform(spread_s=3.0))[0][:2]) < 1.0


def test_empty_trace_and_a_window_past_the_end_are_errors(tmp_path: Path) -> None:
    header_only = tmp_path / "h.csv"
    header_only.write_text("arrival_s,input_tokens,output_tokens\n")
    with pytest.raises(TraceError, match="no request rows to replay"):
        _read(header_only)
    empty_jsonl = tmp_path / "e.jsonl"
    empty_jsonl.write_text("\n")
    with pytest.raises(TraceError, match="no request rows"):
        _read(empty_jsonl)
    path = tmp_path / "t.jsonl"
    path.write_text(_jsonl())
    with pytest.raises(TraceError, match=r"window \[100, inf\) s holds no row; .* 0-6 s"):
        _read(path, transform=Transform(window_start_s=100.0))


def test_cli_refuses_an_empty_trace_and_a_window_past_the_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    header_only = tmp_path / "h.csv"
    header_only.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    base = ["replay", "--config", str(DATA_DIR / "replay-sample.yaml"), "--progress", "never"]
    assert main([*base, "--trace", str(header_only)]) == 2
    assert "no request rows to replay" in capsys.readouterr().err
    sample = DATA_DIR / "replay-sample.csv"
    assert main([*base, "--trace", str(sample), "--window", "5000:6000"]) == 2
    assert "holds no row" in capsys.readouterr().err


def test_a_csv_cell_beyond_the_csv_modules_limit_is_a_trace_error(tmp_path: Path) -> None:
    path = tmp_path / "long.csv"
    path.write_text("arrival_s,input_tokens,output_tokens\n0,1,1\n1,\"" + "9" * 140_000 + "\",1\n")
    with pytest.raises(TraceError, match="not a trace value"):
        _read(path)


@pytest.mark.parametrize("gap", ["4e7", "1e300", "9999-01-01T00:00:00"])
def test_a_span_beyond_a_year_is_refused_at_its_row(tmp_path: Path, gap: str) -> None:
    first = "0" if "T" not in gap else "0001-01-01T00:00:00"
    path = tmp_path / "far.csv"
    path.write_text(f"arrival_s,input_tokens,output_tokens\n{first},5,5\n{gap},5,5\n")
    with pytest.raises(TraceError, match=r"row 2 \(line 3\) comes .* beyond the longest replay"):
        _read(path)
