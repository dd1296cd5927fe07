"""Command line: `vllm-sizer run|demo|plan|fit|simulate|emulate`.

Each subcommand module exposes `register(subparsers)`, which sets the handler as `func` and,
for constraints between flags, a `check(args) -> str | None` returning the problem, reported
like argparse's own errors.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import cast

from prometheus_client import disable_created_metrics

from exporter.commands import demo, emulate, fit, plan, run, simulate
from exporter.commands.version import package_version


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` (default: the process's arguments) and run the chosen subcommand."""
    # `_created` series are noise for gauges-first consumers (KEDA, dashboards) and double the
    # counter series: off for every subcommand, not only in the image.
    cast(Callable[[], None], disable_created_metrics)()  # the library leaves it unannotated
    parser = argparse.ArgumentParser(prog="vllm-sizer", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=package_version())
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (run, demo, plan, fit, simulate, emulate):
        module.register(sub)
    args = parser.parse_args(argv)
    check = getattr(args, "check", None)
    problem = None if check is None else check(args)
    if problem is not None:
        sub.choices[args.command].error(problem)  # exits 2, as for a bad flag value
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
