"""One HTTP request under a total deadline and a body-size cap: how the sizer reads a pod's
/metrics or a Prometheus API answer.

A per-read socket timeout (what `requests` offers) does not bound a request: a server that
sends a byte a second never trips it. Here a watchdog shuts the socket down when the deadline
passes, which ends a blocked connect, header read or body read at once. Redirects are never
followed: a pod that answers 3xx is an HTTP status failure, so a hostile pod cannot point the
sizer at another address.
"""

from __future__ import annotations

import http.client
import math
import socket
import ssl
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from exporter.base.errors import FailureReason
from exporter.config.values import DEFAULT_MAX_RESPONSE_BYTES

_READ_CHUNK = 64 * 1024
MAX_KEPT_LINE_BYTES = 64 * 1024  # a longer line is no exposition sample: dropped unread
MAX_KEPT_BYTES = 1 << 20  # kept lines beyond this: the body is too large (kept is the point)


@dataclass(frozen=True, slots=True)
class HttpResponse:
    """A complete answer: status code, body and content type."""

    status: int
    body: bytes
    content_type: str


class FetchError(Exception):
    """The request did not complete; `reason` is the exported failure label."""

    def __init__(self, reason: FailureReason, message: str) -> None:
        self.reason = reason
        super().__init__(message)


def fetch(
    url: str,
    *,
    deadline_s: float,
    max_body_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    method: str = "GET",
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    ssl_context: ssl.SSLContext | None = None,
    keep_line: Callable[[bytes], bool] | None = None,
) -> HttpResponse:
    """The whole answer to one request within `deadline_s` seconds (connect, headers, body),
    at most `max_body_bytes` of body; FetchError otherwise. With `keep_line`, the body holds
    only the lines it accepts (each ending in a newline), streamed through one small buffer."""
    if not (math.isfinite(deadline_s) and deadline_s > 0):
        raise ValueError(f"`deadline_s` must be a finite number > 0, got {deadline_s}")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FetchError(FailureReason.CONNECTION, f"not an http(s) URL: {url[:200]}")
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(
            parts.hostname, parts.port, timeout=deadline_s, context=ssl_context
        )
    else:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=deadline_s)
    expired = threading.Event()
    # The connection's socket, kept here: http.client drops its own reference once the
    # response says `Connection: close`, while the body is still being read through it.
    sockets: list[socket.socket] = []

    def expire() -> None:
        expired.set()
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed

    watchdog = threading.Timer(deadline_s, expire)
    watchdog.daemon = True
    watchdog.start()
    try:
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn.connect()  # bounded by the socket timeout, which is the whole deadline
        if conn.sock is not None:
            sockets.append(conn.sock)
        if expired.is_set():
            raise _timed_out(deadline_s)
        conn.request(method, target, body=body, headers=dict(headers or {}))
        response = conn.getresponse()
        declared = response.getheader("Content-Length")
        if declared is not None and declared.isascii() and declared.isdigit():
            if int(declared) > max_body_bytes:
                raise _too_large(max_body_bytes)
        if keep_line is None:
            payload = _whole_body(response, max_body_bytes)
        else:
            payload = _kept_lines(response, max_body_bytes, keep_line)
        if expired.is_set():  # the shutdown reads as an early end of the body
            raise _timed_out(deadline_s)
        content_type = response.getheader("Content-Type", "") or ""
        return HttpResponse(response.status, payload, content_type)
    except FetchError:
        raise
    except (OSError, http.client.HTTPException) as exc:
        if expired.is_set() or isinstance(exc, TimeoutError):
            raise _timed_out(deadline_s) from exc
        raise FetchError(FailureReason.CONNECTION, f"{type(exc).__name__}: {exc}") from exc
    finally:
        watchdog.cancel()
        conn.close()


def _whole_body(response: http.client.HTTPResponse, max_body_bytes: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while chunk := response.read1(_READ_CHUNK):
        size += len(chunk)
        if size > max_body_bytes:
            raise _too_large(max_body_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def _kept_lines(
    response: http.client.HTTPResponse, max_body_bytes: int, keep_line: Callable[[bytes], bool]
) -> bytes:
    """The body's lines that `keep_line` accepts. Memory stays at one read buffer and the kept
    lines whatever the body's size: a long-lived thread that held a large body once keeps its
    malloc arena that large for good (glibc gives a thread arena's pages back only rarely)."""
    buffer = memoryview(bytearray(_READ_CHUNK))
    kept: list[bytes] = []
    partial = b""  # the line the last read ended in
    overlong = False  # `partial` was dropped: the rest of its line goes too
    size = kept_bytes = 0
    while count := response.readinto(buffer):
        size += count
        if size > max_body_bytes:
            raise _too_large(max_body_bytes)
        lines = bytes(buffer[:count]).split(b"\n")
        lines[0] = partial + lines[0]
        partial = lines.pop()
        if overlong and lines:
            del lines[0]
            overlong = False
        for line in filter(keep_line, lines):
            kept.append(line + b"\n")
            kept_bytes += len(line) + 1
        if kept_bytes > MAX_KEPT_BYTES:
            raise _too_large(MAX_KEPT_BYTES, " of kept lines")
        if len(partial) > MAX_KEPT_LINE_BYTES:
            partial, overlong = b"", True
    if partial and not overlong and keep_line(partial):
        kept.append(partial + b"\n")
    return b"".join(kept)


def _too_large(limit: int, of: str = "") -> FetchError:
    return FetchError(FailureReason.BODY_TOO_LARGE, f"body larger than {limit} bytes{of}")


def _timed_out(deadline_s: float) -> FetchError:
    return FetchError(FailureReason.TIMEOUT, f"no complete answer within {deadline_s:g} s")
