"""Command line: `vllm-sizer run|demo|plan|fit|simulate|emulate`.

Each subcommand module exposes `register(subparsers)`, which sets the handler as `func`.
"""

from __future__ import annotations

import argparse
import sys

from exporter.commands import demo, emulate, fit, plan, run, simulate
from exporter.commands.version import package_version


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` (default: the process's arguments) and run the chosen subcommand."""
    parser = argparse.ArgumentParser(prog="vllm-sizer", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=package_version())
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (run, demo, plan, fit, simulate, emulate):
        module.register(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
