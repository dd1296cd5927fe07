"""Atomic JSON state file: tuner state and stabilization history survive a restart."""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

STATE_VERSION = 1
# A real state is a few KiB per deployment; reading a larger file would only exhaust memory.
MAX_STATE_BYTES = 64 << 20


class StateFile:
    """Saves a JSON-safe dict by write-to-temp + fsync + rename; loads it back or returns {}."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def save(self, state: dict[str, Any]) -> None:
        """Replace the file atomically: a crash leaves the old or the new state, never half."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        payload = json.dumps({"version": STATE_VERSION, "state": state}, allow_nan=False)
        fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(payload)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def load(self) -> dict[str, Any]:
        """The saved state, or {} when there is none or it cannot be used. A file that is not
        a state this version wrote (garbage, truncated, binary, too large) is renamed aside to
        `<name>.bad-<unix time>` with one warning: the daemon starts fresh, and its first save
        does not destroy what an operator may want to look at."""
        try:
            with self.path.open("rb") as fh:
                raw = fh.read(MAX_STATE_BYTES + 1)
        except FileNotFoundError:
            return {}
        except OSError as exc:  # unreadable, not unusable: left in place, the save reports too
            logger.error("state file %s unreadable, starting fresh: %s", self.path, exc)
            return {}
        problem, state = _parse(raw)
        if problem is not None:
            self.set_aside(problem)
        return state

    def check_writable(self) -> str | None:
        """None when `save` can write here, else why not: creates and removes a temporary file
        in the state file's directory, as `save` does."""
        if self.path.is_dir():
            return f"{self.path} is a directory"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", dir=self.path.parent)
            os.close(fd)
            os.unlink(tmp)
        except OSError as exc:
            return f"cannot write in {self.path.parent}: {exc.strerror or exc}"
        return None

    def set_aside(self, problem: str) -> None:
        """Rename the file to `<name>.bad-<unix time>`, with one warning saying why."""
        aside = self.path.with_name(f"{self.path.name}.bad-{int(time.time())}")
        try:
            os.replace(self.path, aside)
        except OSError as exc:
            logger.warning(
                "state file %s unusable (%s), starting fresh; cannot move it aside: %s",
                self.path,
                problem,
                exc,
            )
            return
        logger.warning(
            "state file %s unusable (%s): moved to %s, starting fresh", self.path, problem, aside
        )


def read_state(path: Path) -> tuple[str | None, dict[str, Any]]:
    """(None, state) of a state file, or (why it cannot be used, {}); never moves the file
    (for a reader beside the daemon, such as `vllm-sizer plan --state`)."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_STATE_BYTES + 1)
    except OSError as exc:
        return f"cannot read: {exc.strerror or exc}", {}
    return _parse(raw)


def _parse(raw: bytes) -> tuple[str | None, dict[str, Any]]:
    """(None, state) for a state file's bytes, or (why it is unusable, {})."""
    if len(raw) > MAX_STATE_BYTES:
        return f"larger than {MAX_STATE_BYTES >> 20} MiB", {}
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return "not UTF-8 text", {}
    except json.JSONDecodeError as exc:
        return f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", {}
    except ValueError as exc:  # an integer of more digits than Python converts
        return f"not JSON: {str(exc)[:80]}", {}
    except RecursionError:
        return "JSON nested too deeply", {}
    if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
        return f"not a version {STATE_VERSION} state", {}
    state = data.get("state")
    if not isinstance(state, dict):
        return "no state mapping", {}
    return None, state
