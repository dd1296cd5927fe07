"""Upstream demand of a deployment that scales to zero: one PromQL value per cycle.

The query (a router's or gateway's request rate, or the length of a queue in front of the
deployment) is read through the Prometheus client, with its deadline and body cap. Anything but
one finite value >= 0 is an error, never a 0: an empty result, several series, NaN, a negative
number. `DemandWatch` logs a failing query once per run of failures, and its recovery.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from exporter.base.errors import FailureReason, PrometheusQueryError, SourceError
from exporter.collector.promapi import QUERY_PATH, PrometheusClient

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DemandRead:
    """The demand query's value (req/s or requests, as configured) at `time_s` (unix s)."""

    value: float
    time_s: float


class DemandSource:
    """Evaluates one deployment's demand query."""

    def __init__(self, *, client: PrometheusClient, query: str, what: str = "demand") -> None:
        """`what` the value is, in error messages (the demand; an accelerator's inventory)."""
        self._client = client
        self.query = query
        self.what = what

    def read(self) -> DemandRead:
        """The value now; PrometheusQueryError (reason bad_value) unless it is one finite
        number >= 0, and the client's errors (timeout, connection, ...) as they are."""
        samples = self._client.query(self.query)
        if len(samples) != 1:
            found = "no series" if not samples else f"{len(samples)} series"
            raise self._bad(
                f"{found}; the {self.what} query must give exactly one value (aggregate with "
                f"sum(); an empty result is an unknown {self.what}, never 0)"
            )
        value = samples[0].value
        if not math.isfinite(value) or value < 0:
            raise self._bad(f"value {value}; the {self.what} must be a finite number >= 0")
        return DemandRead(value=value, time_s=samples[0].time_s)

    def _bad(self, message: str) -> PrometheusQueryError:
        url = self._client.base_url + QUERY_PATH
        return PrometheusQueryError(url, self.query, message, reason=FailureReason.BAD_VALUE)


def read_demand(source: DemandSource) -> DemandRead | SourceError:
    """The demand, or the error that stood in its way (returned, so the vLLM read it travels
    with is not lost)."""
    try:
        return source.read()
    except SourceError as exc:
        return exc


class DemandWatch:
    """One deployment's demand outcomes: logs the first failure of a run and the recovery."""

    def __init__(self, deployment: str) -> None:
        self._deployment = deployment
        self._failing = False

    def failed(self, exc: SourceError) -> None:
        if not self._failing:
            logger.warning(
                "%s: demand query failed (%s), holding the replica count until it answers "
                "(logged once): %s",
                self._deployment,
                exc.reason,
                exc,
            )
        else:
            logger.debug("%s: demand query still failing (%s)", self._deployment, exc.reason)
        self._failing = True

    def answered(self) -> None:
        if self._failing:
            logger.info("%s: demand query answers again", self._deployment)
        self._failing = False
