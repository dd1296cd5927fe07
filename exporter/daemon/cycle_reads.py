"""One deployment's reads of one cycle (its vLLM metrics, the first cycle's look back, the
scale_from_zero demand), run on a reader thread, and the deadline the cycle waits for them."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from exporter.base.errors import FailureReason, SourceError
from exporter.collector.demand import DemandRead, read_demand
from exporter.collector.sources import HistorySource, SourceRead
from exporter.daemon.deployment_state import DeploymentRuntime

logger = logging.getLogger(__name__)

# Reads of all deployments run in parallel, one reader thread per deployment at most (started
# only while every other one is busy), so no number of hanging sources can hold up another
# deployment's read; a cycle waits for them at most this share of its period (each fetch has
# its own deadline besides).
READ_DEADLINE = 0.8


@dataclass(frozen=True, slots=True)
class Reads:
    """One deployment's reads of one cycle; a failed read is its error."""

    history: SourceRead | None  # one period back, if the source can (first cycle only)
    now: SourceRead | SourceError
    demand: DemandRead | SourceError | None  # None without scale_from_zero


def late_read() -> SourceError:
    return SourceError(
        f"no answer within {READ_DEADLINE:.0%} of the cycle period", reason=FailureReason.TIMEOUT
    )


def read_deployment(runtime: DeploymentRuntime, past_s: float) -> Reads:
    """A deployment's reads, run on a reader thread: they touch no daemon state."""
    source = runtime.source
    history = None
    if not runtime.tracker.primed and isinstance(source, HistorySource):
        try:
            history = source.read_at(past_s)
        except SourceError as exc:  # the cycle's own read reports and counts the failure
            logger.debug("%s: no history to start from (%s)", runtime.config.name, exc)
    demand = None if runtime.demand is None else read_demand(runtime.demand)
    try:
        return Reads(history, source.read(), demand)
    except SourceError as exc:
        return Reads(history, exc, demand)
