"""How the daemon speaks in its log: one line per event, the cause in it, and no repetition.

- An unexpected error is one ERROR line naming the exception and its message; the traceback goes
  to DEBUG, for whoever turns it on.
- A source that keeps failing with the same reason is a WARNING once, then DEBUG each cycle, and
  an INFO line when it recovers (saying for how many cycles it failed); a new reason is a new
  WARNING. The failure counter metric still counts every one.
"""

from __future__ import annotations

import logging


def log_unexpected(log: logging.Logger, what: str, exc: BaseException) -> None:
    """`what: ExceptionType: message` at ERROR, the traceback at DEBUG."""
    log.error("%s: %s: %s", what, type(exc).__name__, exc)
    log.debug("%s: traceback", what, exc_info=exc)


class FailureStreaks:
    """Per deployment: the reason it is failing for and the cycles it has failed in a row."""

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._streaks: dict[str, tuple[str, int]] = {}

    def failed(self, name: str, reason: str, message: str) -> None:
        """A failed read of `name`'s source: WARNING when it starts or changes reason."""
        previous, count = self._streaks.get(name, ("", 0))
        if reason != previous:
            self._log.warning(
                "%s: source failed (%s): %s; repeats are logged at debug", name, reason, message
            )
            count = 0
        else:
            self._log.debug("%s: source failed (%s): %s", name, reason, message)
        self._streaks[name] = (reason, count + 1)

    def succeeded(self, name: str) -> None:
        """A good read of `name`'s source: INFO when it ends a streak of failures."""
        streak = self._streaks.pop(name, None)
        if streak is not None:
            reason, count = streak
            self._log.info(
                "%s: source recovered after %d failed cycle(s) (%s)", name, count, reason
            )


class InfeasibleTargets:
    """Per deployment: the targets the model last said it cannot meet at replicas.max. A
    WARNING when that set changes to a non-empty one, an INFO line when it empties."""

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._last: dict[str, tuple[str, ...]] = {}

    def note(self, name: str, targets: tuple[str, ...], max_replicas: int, rate: float) -> None:
        """This cycle's infeasible targets of `name` at a sized-for rate (req/s)."""
        if targets == self._last.get(name, ()):
            return
        self._last[name] = targets
        if targets:
            self._log.warning(
                "%s: target(s) %s cannot be met at replicas.max=%d at %.4g req/s: the model "
                "misses them with every replica allowed", name, ",".join(targets), max_replicas,
                rate,
            )  # fmt: skip
        else:
            self._log.info("%s: every target can be met within replicas.max again", name)
