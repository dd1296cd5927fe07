"""The run envelope every bench writes into its result JSON under the key `run`: which code
(commit, and whether the tree had uncommitted changes), when (UTC start and end), on what
machine (cores, Python, platform, load average at start and end) and by which command.

Usage in a bench:

    run = start_run()                        # first thing in main()
    ...
    out = with_run(run, {"results": rows})   # {"run": {...}, "results": rows}
    path.write_text(json.dumps(out, indent=1))

The documentation's validation pages read their figures from the same JSON files; the envelope
is what lets a reader tell which run a published figure came from.
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RUN_KEY = "run"
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class RunStart:
    """What a bench knows when it starts: kept until it writes its result."""

    started_utc: datetime
    monotonic_s: float
    load_average: tuple[float, float, float]
    command: str
    commit: str
    dirty: bool


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def command_line(argv: list[str] | None = None) -> str:
    """The command as typed from the repository root, without this machine's paths."""
    args = list(sys.argv if argv is None else argv)
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if argv is None and spec is not None and spec.name:
        head = ["python", "-m", spec.name]
    else:
        script = Path(args[0]) if args else Path("?")
        shown = script.as_posix()
        if script.is_absolute():  # as typed when relative; never a path of this machine
            try:
                shown = script.relative_to(REPO_ROOT).as_posix()
            except ValueError:
                shown = script.name
        head = ["python", shown]
    return shlex.join([*head, *args[1:]])


def start_run(argv: list[str] | None = None) -> RunStart:
    """Record the start of a bench run (call before any measured work)."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    return RunStart(
        started_utc=datetime.now(UTC),
        monotonic_s=time.monotonic(),
        load_average=os.getloadavg(),
        command=command_line(argv),
        commit=_git("rev-parse", "HEAD") or "unknown",
        dirty=bool(status),
    )


def run_envelope(run: RunStart) -> dict[str, Any]:
    """The `run` object: commit, dates, machine and load at start and end, command."""
    return {
        "commit": run.commit,
        "dirty": run.dirty,
        "date": run.started_utc.isoformat(timespec="seconds"),
        "finished": datetime.now(UTC).isoformat(timespec="seconds"),
        "wall_s": round(time.monotonic() - run.monotonic_s, 3),
        "command": run.command,
        "machine": {
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "platform": f"{platform.system()} {platform.machine()}",
            "load_average_start": [round(x, 2) for x in run.load_average],
            "load_average_end": [round(x, 2) for x in os.getloadavg()],
        },
    }


def with_run(run: RunStart, payload: dict[str, Any]) -> dict[str, Any]:
    """The payload with the envelope first under RUN_KEY (an existing `run` key is replaced)."""
    return {RUN_KEY: run_envelope(run), **{k: v for k, v in payload.items() if k != RUN_KEY}}
