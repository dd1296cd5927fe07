"""`vllm-sizer emulate` subcommand, through its own parser."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from exporter.cli import emulate


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    emulate.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_emulate_serves_for_the_given_time(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["emulate", "--stop-after-s", "0.3", "--time-scale", "10", "--replicas", "2"]) == 0
    urls = [line for line in capsys.readouterr().out.splitlines() if line.startswith("http://")]
    assert len(urls) == 2


def test_emulate_takes_the_realistic_traffic_options_of_simulate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("input_tokens,output_tokens\n100,400\n3000,20\n")
    argv = ["emulate", "--duration-s", "0.3", "--time-scale", "10", "--lengths-csv", str(pairs),
            "--prefix-hit-share", "0.5", "--burst-ratio", "4", "--burst-period-s", "5"]
    assert run(argv) == 0
    assert run(["emulate", "--duration-s", "0.3", "--lengths", "bimodal"]) == 0
    parser = argparse.ArgumentParser()
    emulate.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["emulate", "--paper-profile", "1", "--burst-ratio", "2"])
    assert "--burst-ratio" in args.check(args)
