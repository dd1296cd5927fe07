"""The streamed trace reader and the rate-profile loader: formats, bad rows, transforms."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from exporter.replay.arrivals import ProfileArrivals, load_rate_profile
from exporter.replay.trace import (
    TraceColumns,
    TraceError,
    TraceReader,
    Transform,
    parse_time,
)
from model.simulation.workloads import LengthDist, LengthKind


def _write(tmp_path: Path, text: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _all(reader: TraceReader, end_s: float = 1e9) -> tuple[list[float], list[int], list[int]]:
    chunk = reader.until(end_s)
    return chunk.arrival_s.tolist(), chunk.input_tokens.tolist(), chunk.output_tokens.tolist()


AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.2500000,879,20
"""


def test_azure_rows_become_seconds_from_the_first_row(tmp_path: Path) -> None:
    reader = TraceReader(_write(tmp_path, AZURE), rng=np.random.default_rng(0))
    times, prompts, outputs = _all(reader)
    assert times == pytest.approx([0.0, 4.314579, 4.56941], abs=1e-6)
    assert prompts == [374, 396, 879] and outputs == [44, 109, 20]
    assert reader.exhausted and reader.columns == TraceColumns(
        "TIMESTAMP", "ContextTokens", "GeneratedTokens"
    )


def test_times_in_seconds_or_iso_with_up_to_seven_fractional_digits() -> None:
    assert parse_time("2023-11-16 18:15:47.1234567") - parse_time(
        "2023-11-16T18:15:46Z"
    ) == pytest.approx(1.123456, abs=1e-6)
    assert parse_time("2023-11-16 19:15:46+01:00") == parse_time("2023-11-16 18:15:46")
    assert parse_time(" 12.5 ") == 12.5
    with pytest.raises(ValueError):
        parse_time("nan")


def test_rows_are_handed_out_window_by_window(tmp_path: Path) -> None:
    text = "arrival_s,input_tokens,output_tokens\n0,1,1\n10,2,2\n30,3,3\n31,4,4\n"
    reader = TraceReader(_write(tmp_path, text), rng=np.random.default_rng(0))
    assert reader.span_s() == 31.0
    assert reader.until(30.0).input_tokens.tolist() == [1, 2, 3]
    assert not reader.exhausted
    assert reader.offered_rps(0.0, 30.0) == pytest.approx(0.1)
    assert reader.until(60.0).input_tokens.tolist() == [4]
    assert reader.exhausted


def test_named_columns_in_any_order(tmp_path: Path) -> None:
    text = "out,when,prompt,extra\n5,100,7,x\n6,101.5,8,y\n"
    reader = TraceReader(_write(tmp_path, text), rng=np.random.default_rng(0),
                         columns=TraceColumns.parse("when,prompt,out"))
    assert _all(reader) == ([0.0, 1.5], [7, 8], [5, 6])


def test_unknown_header_says_how_to_name_the_columns(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="--columns TIME,PROMPT,OUTPUT"):
        TraceReader(_write(tmp_path, "a,b,c\n1,2,3\n"), rng=np.random.default_rng(0))


@pytest.mark.parametrize(
    ("row", "column", "problem"),
    [
        ("2023-11-16 18:15:50,abc,3", "ContextTokens", "must be an integer >= 1"),
        ("2023-11-16 18:15:50,10,0", "GeneratedTokens", "must be an integer >= 1"),
        ("yesterday,10,3", "TIMESTAMP", "must be seconds or an ISO 8601"),
        ("2023-11-16 18:15:50,10", "GeneratedTokens", "missing value"),
        ("2023-11-16 18:15:40,10,3", "TIMESTAMP", "before the previous row's time"),
    ],
)
def test_a_malformed_row_names_its_row_line_and_column(
    tmp_path: Path, row: str, column: str, problem: str
) -> None:
    text = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1,1\n" + row + "\n"
    path = _write(tmp_path, text)
    with pytest.raises(TraceError) as caught, TraceReader(path, rng=np.random.default_rng(0)) as r:
        _all(r)
    message = str(caught.value)
    assert f"row 2 (line 3), column '{column}'" in message and problem in message


def test_skipping_bad_rows_counts_them_and_keeps_the_rest(tmp_path: Path) -> None:
    text = ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1,1\n"
            "2023-11-16 18:15:47,x,1\n2023-11-16 18:15:48,3,-2\n2023-11-16 18:15:49,4,4\n")
    reader = TraceReader(_write(tmp_path, text), rng=np.random.default_rng(0), skip_bad_rows=True)
    assert _all(reader) == ([0.0, 3.0], [1, 4], [1, 4])
    assert reader.bad_rows == 2 and reader.rows == 4


def test_window_and_speed(tmp_path: Path) -> None:
    text = "arrival_s,input_tokens,output_tokens\n" + "".join(
        f"{t},{t + 1},1\n" for t in range(0, 100, 10)
    )
    reader = TraceReader(_write(tmp_path, text), rng=np.random.default_rng(0),
                         transform=Transform(speed=2.0, window_start_s=20.0, window_end_s=60.0))
    times, prompts, _ = _all(reader)
    assert times == [0.0, 5.0, 10.0, 15.0]  # rows at 20, 30, 40, 50 s, twice as fast
    assert prompts == [21, 31, 41, 51]
    assert reader.exhausted


@pytest.mark.parametrize("scale", [0.5, 2.0, 3.5])
def test_rate_scale_scales_the_count_keeps_lengths_and_order(tmp_path: Path, scale: float) -> None:
    rows = 2000
    text = "arrival_s,input_tokens,output_tokens\n" + "".join(
        f"{t * 0.5},{t % 50 + 1},{t % 7 + 1}\n" for t in range(rows)
    )
    path = _write(tmp_path, text)

    def read(seed: int) -> tuple[list[float], list[int], list[int]]:
        reader = TraceReader(path, rng=np.random.default_rng(seed),
                             transform=Transform(rate_scale=scale))
        parts = [reader.until(end) for end in np.arange(50.0, 1100.0, 50.0)]
        return (sum((p.arrival_s.tolist() for p in parts), []),
                sum((p.input_tokens.tolist() for p in parts), []),
                sum((p.output_tokens.tolist() for p in parts), []))

    times, prompts, outputs = read(1)
    assert len(times) == pytest.approx(scale * rows, rel=0.06)
    assert times == sorted(times) and times[-1] <= 999.5
    originals = {(t % 50 + 1, t % 7 + 1) for t in range(rows)}
    assert set(zip(prompts, outputs, strict=True)) <= originals
    assert read(1) == (times, prompts, outputs)  # same seed, same arrivals
    assert read(2) != (times, prompts, outputs)


def test_rate_profile_is_cut_sped_up_scaled_and_drawn_window_by_window(tmp_path: Path) -> None:
    text = "time,rate\n0,1\n100,1\n200,3\n300,3\n"
    path = _write(tmp_path, text, "profile.csv")
    profile, skipped = load_rate_profile(
        path, transform=Transform(speed=2.0, rate_scale=10.0, window_start_s=50.0)
    )
    assert skipped == 0
    assert profile.duration_s == pytest.approx(125.0)  # 50-300 s at twice the speed
    assert float(profile.rate_at(0.0)) == pytest.approx(20.0)  # 1 req/s x 10 x 2
    assert float(profile.rate_at(100.0)) == pytest.approx(60.0)
    dist = LengthDist(LengthKind.FIXED, 8)
    arrivals = ProfileArrivals(profile, np.random.default_rng(3), input_lengths=dist,
                               output_lengths=dist)
    counts = [len(arrivals.until(end)) for end in (30.0, 60.0, 90.0, 120.0, 150.0)]
    assert arrivals.exhausted
    expected = float(profile.cumulative(125.0))
    assert sum(counts) == pytest.approx(expected, rel=0.1)


def test_rate_profile_bad_row_names_row_and_column(tmp_path: Path) -> None:
    path = _write(tmp_path, "timestamp,value\n0,1\n15,-3\n30,2\n", "profile.csv")
    with pytest.raises(TraceError, match=r"row 2 \(line 3\), column 'value': must be a rate"):
        load_rate_profile(path)
    profile, skipped = load_rate_profile(path, skip_bad_rows=True)
    assert skipped == 1 and profile.duration_s == 30.0
