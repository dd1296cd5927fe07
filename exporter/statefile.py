"""Atomic JSON state file: tuner state and stabilization history survive a restart."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

STATE_VERSION = 1


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
        """The saved state, or {} when there is none or it cannot be used (logged)."""
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            logger.error("state file %s unreadable, starting fresh: %s", self.path, exc)
            return {}
        if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
            logger.error("state file %s has an unknown format, starting fresh", self.path)
            return {}
        state = data.get("state")
        return state if isinstance(state, dict) else {}
