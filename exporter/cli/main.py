"""Command line: `vllm-sizer run|demo|plan|fit|simulate|emulate|replay`.

Each subcommand module exposes `register(subparsers)`, which sets the handler as `func` and,
for constraints between flags, a `check(args) -> str | None` returning the problem, reported
like argparse's own errors.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any, cast

from prometheus_client import disable_created_metrics

from exporter.cli import demo, emulate, fit, plan, replay, run, simulate
from exporter.cli.version import package_version

DESCRIPTION = (
    "vllm-sizer sizes vLLM deployments from vLLM's own Prometheus metrics: it keeps a queueing "
    "model of the engine calibrated online and exports the replica count that keeps TTFT and "
    "ITL under their targets. 'run' is the daemon; 'demo' runs it against emulated replicas; "
    "'plan', 'fit', 'simulate' and 'emulate' work with the model offline; 'replay' compares "
    "autoscaling policies on a recorded trace. "
    "'vllm-sizer COMMAND --help' describes each command."
)


class HelpFormatter(argparse.HelpFormatter):
    """Each flag's help ends with its default, where it has one to show (a default of None means
    "not set", and the help text says what that does)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            not action.option_strings
            or "%(default)" in text
            or "(default" in text
            or default is None
            or default is argparse.SUPPRESS
            or isinstance(default, bool)
        ):
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose help shows defaults (every subcommand's parser is one)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def build_parser() -> tuple[Parser, dict[str, Parser]]:
    """The whole command line, and each subcommand's parser by name."""
    parser = Parser(prog="vllm-sizer", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=package_version())
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=Parser
    )
    for module in (run, demo, plan, fit, simulate, emulate, replay):
        module.register(sub)
    return parser, sub.choices


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` (default: the process's arguments) and run the chosen subcommand."""
    # `_created` series are noise for gauges-first consumers (KEDA, dashboards) and double the
    # counter series: off for every subcommand, not only in the image.
    cast(Callable[[], None], disable_created_metrics)()  # the library leaves it unannotated
    parser, commands = build_parser()
    args = parser.parse_args(argv)
    check = getattr(args, "check", None)
    problem = None if check is None else check(args)
    if problem is not None:
        commands[args.command].error(problem)  # exits 2, as for a bad flag value
    try:
        code = int(args.func(args))
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader left (`plan | head`): nothing is lost. stdout goes to /dev/null so that
        # the interpreter's last flush does not fail on the closed pipe again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
