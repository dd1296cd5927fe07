"""Exceptions of the I/O side.

    Exception
    ├── ConfigError                 a bad configuration file (every bad key listed at once)
    └── SourceError                 a metric source failed for one deployment or pod
        ├── ScrapeError             a vLLM /metrics URL could not be fetched or parsed
        └── PrometheusQueryError    a Prometheus HTTP API query failed
"""

from __future__ import annotations

from enum import StrEnum


class FailureReason(StrEnum):
    """Why a read of vLLM's metrics (or of the demand query) failed; the `reason` label of
    vllm_sizer_scrape_errors_total."""

    TIMEOUT = "timeout"
    CONNECTION = "connection"
    HTTP_STATUS = "http_status"
    PARSE = "parse"
    BODY_TOO_LARGE = "body_too_large"  # the answer exceeded the configured size cap
    STALE = "stale"
    RESOLVE = "resolve"
    BAD_RESPONSE = "bad_response"  # Prometheus answered, but not one vector series per pod+metric
    QUERY = "query"  # Prometheus rejected the query
    BAD_VALUE = "bad_value"  # the demand query gave no single finite value >= 0
    TOKEN = "token"  # the bearer token file could not be read
    MODEL_NOT_FOUND = "model_not_found"  # pods answered, none serves the configured model
    INTERNAL = "internal"  # a bug in the sizer, caught by the per-deployment guard


class ConfigError(Exception):
    """Invalid configuration; `problems` lists one 'key.path: message' per bad key."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid configuration:\n  " + "\n  ".join(self.problems))


class SourceError(Exception):
    """A metric source failed; `reason` is the exported label value."""

    def __init__(
        self, message: str, *, reason: FailureReason, deployment: str | None = None
    ) -> None:
        self.reason = reason
        self.deployment = deployment
        super().__init__(message)


class ScrapeError(SourceError):
    """Fetching or parsing one vLLM /metrics endpoint failed."""

    def __init__(
        self, url: str, message: str, *, reason: FailureReason = FailureReason.PARSE
    ) -> None:
        self.url = url
        super().__init__(f"{url}: {message}", reason=reason)


# The reader's queries list every vLLM metric name (about 1.7 KB): a log line shows their start.
QUERY_SHOWN_CHARS = 60


class PrometheusQueryError(SourceError):
    """A query against the Prometheus HTTP API failed."""

    def __init__(
        self, url: str, query: str, message: str, *, reason: FailureReason = FailureReason.QUERY
    ) -> None:
        self.url = url
        self.query = query  # whole, for a debugger; the message shows its start only
        shown = query if len(query) <= QUERY_SHOWN_CHARS else query[:QUERY_SHOWN_CHARS] + "..."
        super().__init__(f"{url}: {message} [query {shown}]", reason=reason)
