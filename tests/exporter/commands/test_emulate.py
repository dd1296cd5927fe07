"""`vllm-sizer emulate` subcommand, through its own parser."""

from __future__ import annotations

import argparse

import pytest

from exporter.commands import emulate


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    emulate.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_emulate_serves_for_the_given_time(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["emulate", "--stop-after-s", "0.3", "--time-scale", "10", "--replicas", "2"]) == 0
    urls = [line for line in capsys.readouterr().out.splitlines() if line.startswith("http://")]
    assert len(urls) == 2
