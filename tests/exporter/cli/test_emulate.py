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


def test_emulate_serves_several_variants_each_on_its_own_replicas(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["emulate", "--stop-after-s", "0.3", "--time-scale", "10", "--rate-rps", "20",
            "--variant", "fast=H100:2", "--variant", "cheap=L40Sx2:1", "--routing", "weighted"]
    assert run(argv) == 0
    lines = [line.split() for line in capsys.readouterr().out.splitlines()
             if line.startswith("http://")]
    assert sorted(variant for _, variant in lines) == ["cheap", "fast", "fast"]
    assert len({url for url, _ in lines}) == 3


@pytest.mark.parametrize(("flag", "message"), [
    ("h100=B200", "accelerator must be one of"),
    ("h100=H100x3", "tensor parallel size must be one of"),
    ("H100", "must be NAME=ACCELERATOR"),
])
def test_a_bad_variant_names_the_flag(
    flag: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    emulate.register(parser.add_subparsers(dest="command", required=True))
    with pytest.raises(SystemExit):
        parser.parse_args(["emulate", "--variant", flag])
    assert message in capsys.readouterr().err


def test_variant_names_must_be_unique() -> None:
    parser = argparse.ArgumentParser()
    emulate.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["emulate", "--variant", "a=H100", "--variant", "a=A100"])
    assert "names must be unique" in args.check(args)
