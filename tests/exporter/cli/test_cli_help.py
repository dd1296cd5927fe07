"""The command line explains itself: every flag of every subcommand has help, every default is
shown, one name per concept (former names are hidden aliases that still work), and plots label
log axes with plain numbers."""

from __future__ import annotations

import argparse

import matplotlib
import pytest

from exporter.cli.fleet_options import add_renamed_flag
from exporter.cli.main import DESCRIPTION, build_parser, main

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from exporter.base.plot_axes import integer_ticks, plain_log_ticks  # noqa: E402

COMMANDS = build_parser()[1]
# A concept's one flag name, and the subcommands where it exists.
ONE_NAME = {
    "--max-num-seqs": {"simulate", "emulate", "plan", "fit"},
    "--max-num-batched-tokens": {"simulate", "emulate", "plan", "fit"},
    "--input-tokens": {"simulate", "emulate", "plan", "replay"},
    "--seed": {"simulate", "emulate", "demo", "replay"},
    "--time-scale": {"emulate", "demo"},
}
RENAMED = {
    "--max-batch-size": "--max-num-seqs",
    "--duration-s": "--stop-after-s",
    "--model": "--preset",
}


def visible_flags(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_flag_has_help_and_shows_its_default(command: str) -> None:
    parser = COMMANDS[command]
    text = parser.format_help()
    assert parser.description, command
    for action in visible_flags(parser):
        assert action.help and action.help.strip(), f"{command} {action.option_strings[0]}"
        if action.default not in (None, argparse.SUPPRESS) and not isinstance(action.default, bool):
            assert "default" in parser._get_formatter()._expand_help(action), action.dest
    for action in parser._actions:
        if action.help == argparse.SUPPRESS:  # only former names are hidden
            assert set(action.option_strings) <= set(RENAMED), action.option_strings
            assert action.option_strings[0] not in text


def test_help_output_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["emulate", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--rate-rps RATE_RPS arrival rate of the whole fleet (not per replica)" in out
    assert "(default: 5.0)" in out and "(default: emulated)" in out
    assert "--max-batch-size" not in out and "--duration-s" not in out


def test_top_level_description_is_text() -> None:
    assert "`" not in DESCRIPTION and DESCRIPTION.endswith(".")
    assert build_parser()[0].description == DESCRIPTION


@pytest.mark.parametrize(("flag", "commands"), sorted(ONE_NAME.items()))
def test_one_name_per_concept(flag: str, commands: set[str]) -> None:
    having = {
        name
        for name, parser in COMMANDS.items()
        if any(flag in a.option_strings for a in visible_flags(parser))
    }
    assert having == commands


@pytest.mark.parametrize(
    ("argv", "dest", "value"),
    [
        (["simulate", "--max-batch-size", "64"], "max_num_seqs", 64),
        (["emulate", "--max-batch-size", "32"], "max_num_seqs", 32),
        (["emulate", "--duration-s", "3"], "stop_after_s", 3.0),
        (["plan", "--model", "qwen2.5-14b-h100"], "preset", "qwen2.5-14b-h100"),
    ],
)
def test_a_former_flag_name_still_works_and_names_the_new_one(
    argv: list[str], dest: str, value: object, capsys: pytest.CaptureFixture[str]
) -> None:
    args = build_parser()[0].parse_args(argv)
    assert getattr(args, dest) == value
    old = argv[1]
    assert f"warning: {old} is deprecated, use {RENAMED[old]}" in capsys.readouterr().err


def test_the_new_name_wins_its_default_when_the_former_is_absent() -> None:
    parser = argparse.ArgumentParser()
    new = parser.add_argument("--new", type=int, default=7)
    add_renamed_flag(parser, "--old", new)
    assert parser.parse_args([]).new == 7
    assert parser.parse_args(["--old", "3"]).new == 3


def tick_texts(ax: plt.Axes) -> list[str]:
    ax.figure.canvas.draw()
    labels = [*ax.get_xticklabels(which="both"), *ax.get_yticklabels(which="both")]
    return [t.get_text() for t in labels if t.get_text()]


def test_log_axes_are_labelled_with_plain_numbers() -> None:
    fig, ax = plt.subplots()
    ax.loglog([18.0, 45.0], [17.0, 42.0])  # less than a decade: minor ticks get labels
    before = tick_texts(ax)
    assert any("times" in t or "^" in t for t in before)  # matplotlib's own: 2x10^1
    plain_log_ticks(ax)
    after = tick_texts(ax)
    assert after and all(t.replace(",", "").replace(".", "").isdigit() for t in after), after
    assert "20" in after
    plt.close(fig)


def test_replica_axis_ticks_are_whole_numbers() -> None:
    fig, ax = plt.subplots()
    ax.step([0, 1, 2, 3], [1, 2, 3, 2])
    integer_ticks(ax)
    fig.canvas.draw()
    assert all(float(v).is_integer() for v in ax.get_yticks())
    plt.close(fig)
