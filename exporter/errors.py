"""Exceptions of the I/O side.

    Exception
    ├── ConfigError                 a bad configuration file (every bad key listed at once)
    └── SourceError                 a metric source failed for one deployment or pod
        ├── ScrapeError             a vLLM /metrics URL could not be fetched or parsed
        └── PrometheusQueryError    a Prometheus HTTP API query failed
"""

from __future__ import annotations


class ConfigError(Exception):
    """Invalid configuration; `problems` lists one 'key.path: message' per bad key."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid configuration:\n  " + "\n  ".join(self.problems))


class SourceError(Exception):
    """A metric source failed; `reason` is a short machine-readable label value."""

    def __init__(self, message: str, *, reason: str, deployment: str | None = None) -> None:
        self.reason = reason
        self.deployment = deployment
        super().__init__(message)


class ScrapeError(SourceError):
    """Fetching or parsing one vLLM /metrics endpoint failed."""

    def __init__(self, url: str, message: str, *, reason: str = "scrape") -> None:
        self.url = url
        super().__init__(f"{url}: {message}", reason=reason)


class PrometheusQueryError(SourceError):
    """A query against the Prometheus HTTP API failed."""

    def __init__(self, url: str, query: str, message: str, *, reason: str = "prometheus") -> None:
        self.url = url
        self.query = query
        super().__init__(f"{url} [{query}]: {message}", reason=reason)
