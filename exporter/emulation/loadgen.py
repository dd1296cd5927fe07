"""Open-loop load generator for a vLLM server on loopback: Poisson arrivals, streaming completions.

Each request is a `/v1/completions` call with `stream=true`, a prompt given as token ids (so the
input length is exact), `ignore_eos` and `max_tokens` (so the output length is exact). Per request
it records the send time, TTFT, the gaps between streamed chunks (ITL) and the token counts that the
server reports in its final usage chunk. Runs are bounded in request count and in time.

HTTP/1.1 is spoken over asyncio streams directly: the targets are loopback servers only, one
connection per request, so the few lines of chunked-transfer and server-sent-event parsing cost less
than a new dependency, and chunk arrival times are taken as the bytes arrive, with no client buffer
in between.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from exporter.clock import Clock, SystemClock

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 120.0
DEFAULT_DRAIN_S = 120.0
DEFAULT_MAX_REQUESTS = 10_000
# Token ids below this are left out of random prompts: byte-level BPE vocabularies put their
# special tokens first, and a BOS/EOS inside a prompt would change what the model computes.
DEFAULT_LOW_TOKEN_ID = 16
_MAX_HEADER_LINES = 100
_MAX_ERROR_BODY_BYTES = 4096
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


def arrival_offsets_s(
    rate_rps: float, duration_s: float, max_requests: int, rng: np.random.Generator
) -> np.ndarray:
    """Poisson arrival times in [0, duration_s) (s), at most max_requests of them."""
    # Draw in blocks: a Poisson count with a generous margin almost always covers the window.
    expected = rate_rps * duration_s
    block = int(expected + 6.0 * np.sqrt(expected) + 16)
    times = np.cumsum(rng.exponential(1.0 / rate_rps, size=block))
    while times[-1] < duration_s and times.size < max_requests:
        more = times[-1] + np.cumsum(rng.exponential(1.0 / rate_rps, size=block))
        times = np.concatenate([times, more])
    times = times[times < duration_s][:max_requests]
    times.setflags(write=False)
    return times


def random_prompt(spec: LoadSpec, rng: np.random.Generator) -> list[int]:
    """A prompt of exactly spec.input_tokens random token ids."""
    ids = rng.integers(spec.low_token_id, spec.vocab_size, size=spec.input_tokens)
    return [int(i) for i in ids]


async def run_load(
    spec: LoadSpec, rng: np.random.Generator, clock: Clock | None = None
) -> LoadResult:
    """Send Poisson arrivals for spec.duration_s, then wait up to spec.drain_s for stragglers."""
    clock = clock or SystemClock()
    offsets = arrival_offsets_s(spec.rate_rps, spec.duration_s, spec.max_requests, rng)
    prompts = [random_prompt(spec, rng) for _ in range(offsets.size)]
    start_unix_s = clock.time()
    start_s = clock.monotonic()
    tasks: list[asyncio.Task[RequestRecord]] = []
    for index, (offset_s, prompt) in enumerate(zip(offsets, prompts, strict=True)):
        delay_s = start_s + float(offset_s) - clock.monotonic()
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        coro = _one_request(spec, index, prompt, clock, start_s)
        tasks.append(asyncio.create_task(coro))
    deadline_s = start_s + spec.duration_s + spec.drain_s
    records: list[RequestRecord] = []
    if tasks:
        done, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline_s - clock.monotonic()))
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for index, task in enumerate(tasks):
            if task in done:
                records.append(task.result())
            else:
                records.append(
                    _failed(
                        index,
                        RequestStatus.TIMEOUT,
                        float(offsets[index]),
                        clock.monotonic() - start_s,
                        "not finished by the drain deadline",
                    )
                )
    elapsed_s = clock.monotonic() - start_s
    logger.info(
        "load run: rate=%.3f rps shape=%d/%d sent=%d failed=%d elapsed=%.1fs",
        spec.rate_rps,
        spec.input_tokens,
        spec.output_tokens,
        len(records),
        sum(1 for r in records if not r.ok),
        elapsed_s,
    )
    return LoadResult(
        spec=spec, start_unix_s=start_unix_s, elapsed_s=elapsed_s, records=tuple(records)
    )


def completion_payload(spec: LoadSpec, prompt: list[int]) -> dict[str, Any]:
    """The JSON body of one streaming completion with an exact output length."""
    return {
        "model": spec.model,
        "prompt": prompt,
        "max_tokens": spec.output_tokens,
        "min_tokens": spec.output_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def _one_request(
    spec: LoadSpec, index: int, prompt: list[int], clock: Clock, start_s: float
) -> RequestRecord:
    send_s = clock.monotonic() - start_s
    try:
        return await asyncio.wait_for(
            _stream_completion(spec, index, prompt, clock, start_s, send_s), spec.timeout_s
        )
    except TimeoutError:
        return _failed(
            index,
            RequestStatus.TIMEOUT,
            send_s,
            clock.monotonic() - start_s,
            f"no complete response within {spec.timeout_s} s",
        )
    except OSError as exc:
        return _failed(
            index, RequestStatus.CONNECT_ERROR, send_s, clock.monotonic() - start_s, str(exc)
        )
    except (ValueError, asyncio.IncompleteReadError) as exc:
        return _failed(
            index, RequestStatus.PROTOCOL_ERROR, send_s, clock.monotonic() - start_s, str(exc)
        )


def _failed(
    index: int, status: RequestStatus, send_s: float, end_s: float, message: str
) -> RequestRecord:
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


async def _stream_completion(
    spec: LoadSpec, index: int, prompt: list[int], clock: Clock, start_s: float, send_s: float
) -> RequestRecord:
    parts = urlsplit(spec.base_url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or 80
    body = json.dumps(completion_payload(spec, prompt)).encode()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        head = (
            f"POST {parts.path.rstrip('/')}/v1/completions HTTP/1.1\r\n"
            f"Host: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        )
        writer.write(head.encode() + body)
        await writer.drain()
        status_code, headers = await _read_head(reader)
        if status_code != 200:
            text = await reader.read(_MAX_ERROR_BODY_BYTES)
            return _failed(
                index,
                RequestStatus.HTTP_ERROR,
                send_s,
                clock.monotonic() - start_s,
                f"HTTP {status_code}: {text.decode(errors='replace')}",
            )
        events = _SseEvents()
        event_times_s: list[float] = []
        async for chunk in _body_chunks(reader, headers):
            now_s = clock.monotonic() - start_s
            for data in events.feed(chunk):
                if _has_choice(data):
                    event_times_s.append(now_s)
        end_s = clock.monotonic() - start_s
    finally:
        writer.close()
    if not events.done:
        raise ValueError("stream ended without [DONE]")
    if not event_times_s:
        raise ValueError("stream carried no tokens")
    usage = events.usage
    output_tokens = int(usage.get("completion_tokens", len(event_times_s)))
    prompt_tokens = int(usage.get("prompt_tokens", len(prompt)))
    gaps = np.diff(np.asarray(event_times_s)) * 1000.0
    return RequestRecord(
        index=index,
        status=RequestStatus.OK,
        send_s=send_s,
        end_s=end_s,
        ttft_ms=(event_times_s[0] - send_s) * 1000.0,
        itl_ms=tuple(float(g) for g in gaps),
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
    )


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    status_line = (await reader.readline()).decode("latin-1").strip()
    pieces = status_line.split(" ", 2)
    if len(pieces) < 2 or not pieces[0].startswith("HTTP/") or not pieces[1].isdigit():
        raise ValueError(f"bad HTTP status line {status_line!r}")
    headers: dict[str, str] = {}
    for _ in range(_MAX_HEADER_LINES):
        line = (await reader.readline()).decode("latin-1").strip()
        if not line:
            return int(pieces[1]), headers
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    raise ValueError(f"more than {_MAX_HEADER_LINES} header lines")


async def _body_chunks(
    reader: asyncio.StreamReader, headers: dict[str, str]
) -> AsyncIterator[bytes]:
    """Yield body bytes as they arrive, undoing chunked transfer encoding when it is used."""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size_line = (await reader.readline()).split(b";", 1)[0].strip()
            if not size_line:
                raise ValueError("connection closed inside a chunked body")
            size = int(size_line, 16)
            if size == 0:
                await reader.readline()  # the blank line after the last chunk (no trailers)
                return
            data = await reader.readexactly(size)
            await reader.readexactly(2)  # CRLF after each chunk
            yield data
    else:
        # Content-Length or read-until-close: both end with EOF under Connection: close.
        while data := await reader.read(65536):
            yield data


class _SseEvents:
    """Incremental server-sent-events parser for `data:` lines; remembers [DONE] and usage."""

    def __init__(self) -> None:
        self._buffer = b""
        self.done = False
        self.usage: dict[str, Any] = {}

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        events: list[dict[str, Any]] = []
        for raw in lines:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                continue
            event = json.loads(payload)
            if not isinstance(event, dict):
                raise ValueError(f"event is not a JSON object: {payload[:80]!r}")
            if isinstance(event.get("usage"), dict):
                self.usage = event["usage"]
            events.append(event)
        return events


def _has_choice(event: dict[str, Any]) -> bool:
    choices = event.get("choices")
    return isinstance(choices, list) and len(choices) > 0


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
