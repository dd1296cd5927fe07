"""One streaming `/v1/completions` request over HTTP/1.1 on asyncio streams -> a `RequestRecord`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from exporter.base.clock import Clock
from exporter.testbed.load_run import LoadSpec, RequestRecord, RequestStatus, failed_record

# HTTP/1.1 is spoken over asyncio streams directly: the targets are loopback servers only, one
# connection per request, so the few lines of chunked-transfer and server-sent-event parsing cost
# less than a new dependency, and chunk arrival times are taken as the bytes arrive, with no client
# buffer in between.

_MAX_HEADER_LINES = 100
_MAX_ERROR_BODY_BYTES = 4096


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


async def one_request(
    spec: LoadSpec, index: int, prompt: list[int], clock: Clock, start_s: float
) -> RequestRecord:
    """Send one streaming completion; never raises: a failure is a record with its status."""
    send_s = clock.monotonic() - start_s
    try:
        return await asyncio.wait_for(
            _stream_completion(spec, index, prompt, clock, start_s, send_s), spec.timeout_s
        )
    except TimeoutError:
        return failed_record(
            index,
            RequestStatus.TIMEOUT,
            send_s,
            clock.monotonic() - start_s,
            f"no complete response within {spec.timeout_s} s",
        )
    except OSError as exc:
        return failed_record(
            index, RequestStatus.CONNECT_ERROR, send_s, clock.monotonic() - start_s, str(exc)
        )
    except (ValueError, asyncio.IncompleteReadError) as exc:
        return failed_record(
            index, RequestStatus.PROTOCOL_ERROR, send_s, clock.monotonic() - start_s, str(exc)
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
            return failed_record(
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
