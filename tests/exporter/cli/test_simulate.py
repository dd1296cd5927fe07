"""`vllm-sizer simulate` subcommand, through its own parser."""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import pytest

from exporter.cli import simulate


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    simulate.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_simulate_prints_percentiles_and_writes_csv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sim.csv"
    code = run(["simulate", "--rates", "1,4", "--duration-s", "60", "--warmup-s", "10",
                "--input-tokens", "256", "--output-tokens", "64", "--csv", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "p99" in printed
    with out.open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["load"] for r in rows] == ["1", "4"]
    assert float(rows[0]["ttft_mean_ms"]) <= float(rows[1]["ttft_mean_ms"])
    assert float(rows[0]["itl_p50_ms"]) > 0


def test_simulate_replays_a_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n0.5,100,10\n0.0,200,20\n")
    out = tmp_path / "out.csv"
    assert run(["simulate", "--trace", str(trace), "--csv", str(out)]) == 0
    with out.open() as fh:
        (row,) = list(csv.DictReader(fh))
    assert (row["load"], row["requests"], row["completed"]) == ("trace.csv", "2", "2")
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,input_tokens\n0.0,5\n")
    assert run(["simulate", "--trace", str(bad)]) == 2
    assert "output_tokens" in capsys.readouterr().err
    negative = tmp_path / "negative.csv"
    negative.write_text("arrival_s,input_tokens,output_tokens\n0.0,-5,10\n")
    assert run(["simulate", "--trace", str(negative)]) == 2
    assert f"argument --trace: {negative}:" in capsys.readouterr().err  # names the flag


def test_simulate_reports_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        run(["simulate", "--alpha-ms", "0"])
    assert exited.value.code == 2
    assert "--alpha-ms" in capsys.readouterr().err  # the flag, not an internal name


def test_simulate_takes_realistic_traffic(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("input_tokens,output_tokens\n100,400\n3000,20\n")
    out = tmp_path / "out.csv"
    base = ["simulate", "--rates", "2", "--duration-s", "120", "--warmup-s", "10"]
    assert run([*base, "--lengths-csv", str(pairs), "--prefix-hit-share", "0.5",
                "--burst-ratio", "4", "--burst-period-s", "20", "--csv", str(out)]) == 0
    assert run([*base, "--lengths", "bimodal"]) == 0
    with out.open() as fh:
        (row,) = list(csv.DictReader(fh))
    assert int(row["completed"]) > 100
    bad = tmp_path / "bad.csv"
    bad.write_text("input_tokens\n5\n")
    assert run([*base, "--lengths-csv", str(bad)]) == 2
    assert "output_tokens" in capsys.readouterr().err


def test_modulating_the_paper_profile_is_refused() -> None:
    parser = argparse.ArgumentParser()
    simulate.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["simulate", "--paper-profile", "1", "--burst-ratio", "2"])
    assert "--burst-ratio" in args.check(args)
    args = parser.parse_args(["simulate", "--rates", "1", "--burst-ratio", "2"])
    assert args.check(args) is None
