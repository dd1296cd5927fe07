"""Connections over the server's limit: their request heads read by one thread, and the
sizer's own health and metrics served from reserved threads, everything else answered 503.

The kubelet's probes and Prometheus share the port with every other client, and on loopback
or behind a proxy they share its address too: only what a connection asks for tells a probe
from a flood. A client holding a connection without sending costs here one file descriptor
and a few hundred bytes, never a thread, and is dropped after a short deadline; when more are
waiting than `max_pending`, the one waiting longest goes first unless its request has come
(a probe sends its request at once).
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

PRIORITY_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
MAX_HEAD_BYTES = 8192  # a probe's request head is a few hundred bytes
DEFAULT_RESERVED = 8  # threads for priority requests over the limit
DEFAULT_HEAD_DEADLINE_S = 2.0

_BUSY_BODY = b"too many connections\n"
BUSY_REPLY = (
    b"HTTP/1.0 503 Service Unavailable\r\nServer: vllm-sizer\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\nRetry-After: 1\r\n"
    b"Content-Length: " + str(len(_BUSY_BODY)).encode() + b"\r\n\r\n" + _BUSY_BODY
)

# (connection, client address, the head bytes already read) -> serves it on a thread of its own.
Serve = Callable[[socket.socket, Any, bytes], None]


def answer_busy(sock: socket.socket) -> None:
    """503 on a connection that will not be served, never blocking: a fresh socket's send
    buffer takes the few bytes. What the client already sent is read and dropped first, since
    closing a socket with unread data resets the connection, which can discard the 503 unread."""
    with contextlib.suppress(OSError):
        sock.setblocking(False)
        sock.sendall(BUSY_REPLY)
        sock.recv(65536)


def is_priority_head(head: bytes) -> bool:
    """True for a GET or HEAD of /healthz, /readyz or /metrics."""
    parts = head.split(b"\r\n", 1)[0].split(b" ")
    if len(parts) < 2 or parts[0] not in (b"GET", b"HEAD"):
        return False
    try:
        return urlsplit(parts[1].decode("ascii")).path in PRIORITY_PATHS
    except (UnicodeDecodeError, ValueError):
        return False


@dataclass(slots=True)
class _Pending:
    sock: socket.socket
    address: Any
    deadline_s: float
    head: bytearray = field(default_factory=bytearray)


class Triage:
    """One thread reading the heads of connections over the limit; a priority request gets
    one of `reserved` slots and is handed to `serve`, which must release it through
    `release()` once the connection ends."""

    def __init__(
        self,
        serve: Serve,
        *,
        reserved: int = DEFAULT_RESERVED,
        max_pending: int = 64,
        head_deadline_s: float = DEFAULT_HEAD_DEADLINE_S,
    ) -> None:
        self._serve = serve
        self._slots = threading.BoundedSemaphore(reserved)
        self._max_pending = max_pending
        self._head_deadline_s = head_deadline_s
        self._selector = selectors.DefaultSelector()
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._wake_write.setblocking(False)
        self._selector.register(self._wake_read, selectors.EVENT_READ)
        self._lock = threading.Lock()
        self._incoming: list[tuple[socket.socket, Any]] = []
        self._pending: dict[socket.socket, _Pending] = {}  # insertion order: oldest first
        self._closed = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="vllm-sizer-http-triage", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def add(self, sock: socket.socket, address: Any) -> None:
        """Take a connection the server has no slot for (called from the accepting thread)."""
        with self._lock:
            self._incoming.append((sock, address))
        with contextlib.suppress(OSError):  # a full wake-up pipe already wakes the thread
            self._wake_write.send(b"\0")

    def release(self) -> None:
        """A priority connection handed to `serve` has ended."""
        self._slots.release()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._wake_write.send(b"\0")
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for pending in list(self._pending.values()):
            self._drop(pending, busy=False)
        with self._lock:
            leftover, self._incoming = self._incoming, []
        for sock, _ in leftover:
            sock.close()
        self._selector.close()
        self._wake_read.close()
        self._wake_write.close()

    def _run(self) -> None:
        while not self._closed.is_set():
            timeout = None
            if self._pending:
                oldest = next(iter(self._pending.values()))
                timeout = max(0.0, oldest.deadline_s - time.monotonic())
            for key, _ in self._selector.select(timeout):
                if key.fileobj is self._wake_read:
                    with contextlib.suppress(OSError):
                        self._wake_read.recv(4096)
                else:
                    self._read(self._pending[key.fileobj])  # type: ignore[index]
            self._take_incoming()
            self._expire()

    def _take_incoming(self) -> None:
        with self._lock:
            incoming, self._incoming = self._incoming, []
        for sock, address in incoming:
            while len(self._pending) >= self._max_pending:
                self._make_room()
            sock.setblocking(False)
            pending = _Pending(sock, address, time.monotonic() + self._head_deadline_s)
            self._pending[sock] = pending
            self._selector.register(sock, selectors.EVENT_READ)

    def _make_room(self) -> None:
        """Read the connection waiting longest, and drop it if it still has not sent its whole
        head: a probe's request is then already in the socket, a flood's silent one never."""
        oldest = next(iter(self._pending.values()))
        self._read(oldest)
        if self._pending.get(oldest.sock) is oldest:
            self._drop(oldest, busy=True)

    def _expire(self) -> None:
        now = time.monotonic()
        while self._pending:
            oldest = next(iter(self._pending.values()))
            if oldest.deadline_s > now:
                return
            self._drop(oldest, busy=True)

    def _read(self, pending: _Pending) -> None:
        try:
            chunk = pending.sock.recv(MAX_HEAD_BYTES + 1 - len(pending.head))
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(pending, busy=False)
            return
        pending.head += chunk
        if b"\r\n\r\n" not in pending.head and b"\n\n" not in pending.head:
            if len(pending.head) > MAX_HEAD_BYTES:
                self._drop(pending, busy=True)
            return
        if not is_priority_head(bytes(pending.head)) or not self._slots.acquire(blocking=False):
            self._drop(pending, busy=True)
            return
        self._forget(pending)
        pending.sock.setblocking(True)
        try:
            self._serve(pending.sock, pending.address, bytes(pending.head))
        except BaseException:
            self._slots.release()
            pending.sock.close()
            raise

    def _forget(self, pending: _Pending) -> None:
        self._selector.unregister(pending.sock)
        del self._pending[pending.sock]

    def _drop(self, pending: _Pending, *, busy: bool) -> None:
        self._forget(pending)
        if busy:
            answer_busy(pending.sock)
        with contextlib.suppress(OSError):
            pending.sock.close()
