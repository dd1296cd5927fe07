"""What a load run is given and what it returns: `LoadSpec`, `RequestRecord`s, `LoadResult`."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from enum import StrEnum
from urllib.parse import urlsplit

import numpy as np

DEFAULT_TIMEOUT_S = 120.0
DEFAULT_DRAIN_S = 120.0
DEFAULT_MAX_REQUESTS = 10_000
# Token ids below this are left out of random prompts: byte-level BPE vocabularies put their
# special tokens first, and a BOS/EOS inside a prompt would change what the model computes.
DEFAULT_LOW_TOKEN_ID = 16
_LOOPBACK_NAMES = frozenset({"localhost"})


class RequestStatus(StrEnum):
    """How one request ended."""

    OK = "ok"
    HTTP_ERROR = "http_error"
    CONNECT_ERROR = "connect_error"
    PROTOCOL_ERROR = "protocol_error"
    TIMEOUT = "timeout"


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadSpec:
    """One load run: where, what shape, how fast (req/s) and for how long (s)."""

    base_url: str
    model: str
    rate_rps: float
    input_tokens: int
    output_tokens: int
    duration_s: float
    max_requests: int = DEFAULT_MAX_REQUESTS
    vocab_size: int = 4096
    low_token_id: int = DEFAULT_LOW_TOKEN_ID
    timeout_s: float = DEFAULT_TIMEOUT_S
    drain_s: float = DEFAULT_DRAIN_S

    def __post_init__(self) -> None:
        _require_loopback_url(self.base_url)
        _require(self.rate_rps > 0, "rate_rps", self.rate_rps, "a number > 0")
        _require(self.input_tokens >= 1, "input_tokens", self.input_tokens, "an integer >= 1")
        _require(self.output_tokens >= 1, "output_tokens", self.output_tokens, "an integer >= 1")
        _require(self.duration_s > 0, "duration_s", self.duration_s, "a number > 0")
        _require(self.max_requests >= 1, "max_requests", self.max_requests, "an integer >= 1")
        _require(
            self.vocab_size > self.low_token_id >= 0,
            "vocab_size",
            self.vocab_size,
            f"an integer > low_token_id ({self.low_token_id})",
        )
        _require(self.timeout_s > 0, "timeout_s", self.timeout_s, "a number > 0")
        _require(self.drain_s >= 0, "drain_s", self.drain_s, "a number >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestRecord:
    """One request: times in s since the run started, latencies in ms; None where not reached."""

    index: int
    status: RequestStatus
    send_s: float
    end_s: float
    ttft_ms: float | None
    itl_ms: tuple[float, ...]
    prompt_tokens: int
    output_tokens: int
    message: str = ""

    @property
    def ok(self) -> bool:
        """True when the request completed with HTTP 200 and a full stream."""
        return self.status is RequestStatus.OK

    @property
    def e2e_ms(self) -> float:
        """Send to last byte (ms)."""
        return (self.end_s - self.send_s) * 1000.0

    @property
    def tpot_ms(self) -> float | None:
        """This request's mean time per output token after the first (ms), as vLLM defines it."""
        if self.ttft_ms is None or self.output_tokens < 2:
            return None
        return (self.e2e_ms - self.ttft_ms) / (self.output_tokens - 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadResult:
    """A finished run: its spec, when it started (unix s), how long it took (s), every request."""

    spec: LoadSpec
    start_unix_s: float
    elapsed_s: float
    records: tuple[RequestRecord, ...] = field(repr=False)

    @property
    def sent(self) -> int:
        """Requests sent."""
        return len(self.records)

    @property
    def completed(self) -> tuple[RequestRecord, ...]:
        """Requests that finished successfully."""
        return tuple(r for r in self.records if r.ok)

    @property
    def failed(self) -> int:
        """Requests that did not finish successfully."""
        return self.sent - len(self.completed)

    @property
    def prompt_tokens_total(self) -> int:
        """Prompt tokens of the completed requests."""
        return sum(r.prompt_tokens for r in self.completed)

    @property
    def output_tokens_total(self) -> int:
        """Output tokens of the completed requests."""
        return sum(r.output_tokens for r in self.completed)

    def completed_between(self, start_s: float, end_s: float) -> tuple[RequestRecord, ...]:
        """Completed requests whose last byte arrived in [start_s, end_s) (s since run start)."""
        return tuple(r for r in self.completed if start_s <= r.end_s < end_s)

    def mean_ttft_ms(self) -> float | None:
        """Mean TTFT over completed requests (ms)."""
        values = [r.ttft_ms for r in self.completed if r.ttft_ms is not None]
        return float(np.mean(values)) if values else None


def failed_record(
    index: int, status: RequestStatus, send_s: float, end_s: float, message: str
) -> RequestRecord:
    """The record of a request that did not complete: no latencies, no tokens."""
    return RequestRecord(
        index=index,
        status=status,
        send_s=send_s,
        end_s=end_s,
        ttft_ms=None,
        itl_ms=(),
        prompt_tokens=0,
        output_tokens=0,
        message=message,
    )


def _require(ok: bool, name: str, value: object, allowed: str) -> None:
    if not ok:
        raise ValueError(f"`{name}` must be {allowed}, got {value!r}")


def _require_loopback_url(url: str) -> None:
    parts = urlsplit(url)
    host = parts.hostname or ""
    loopback = host in _LOOPBACK_NAMES
    if not loopback:
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
    if parts.scheme != "http" or not loopback:
        raise ValueError(f"`base_url` must be an http:// URL on a loopback host, got {url!r}")
