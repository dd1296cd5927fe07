"""A misbehaving HTTP server on loopback: drips, hangs, floods, redirects or serves by turns.

Raw sockets, so a fault can be exactly what a broken pod or proxy does on the wire. Every
connection thread stops when the server stops, and a drip ends after `max_seconds` at most.
"""

from __future__ import annotations

import itertools
import socket
import threading
import time
from collections.abc import Callable, Sequence
from enum import StrEnum


class Fault(StrEnum):
    SERVE = "serve"  # 200 with the next body (bodies taken in turn: round robin)
    DRIP = "drip"  # headers, then one byte of body every `drip_interval_s`
    HANG = "hang"  # accept, read the request, never answer
    HUGE = "huge"  # a chunked body that never ends
    REDIRECT = "redirect"  # 302 to `redirect_to`


class FaultServer:
    def __init__(
        self,
        fault: Fault = Fault.SERVE,
        bodies: Sequence[str] | Callable[[], str] = ("",),
        *,
        redirect_to: str = "http://127.0.0.1:1/metrics",
        drip_interval_s: float = 0.2,
        max_seconds: float = 60.0,
    ) -> None:
        self.fault = fault
        self._bodies: Callable[[], str]
        if callable(bodies):
            self._bodies = bodies
        else:
            cycle = itertools.cycle(bodies)
            self._bodies = lambda: next(cycle)
        self.redirect_to = redirect_to
        self.drip_interval_s = drip_interval_s
        self.max_seconds = max_seconds
        self.requests = 0
        self._stop = threading.Event()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}/metrics"

    def __enter__(self) -> FaultServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        deadline = time.monotonic() + self.max_seconds
        with conn:
            conn.settimeout(1.0)
            try:
                request = b""
                while b"\r\n\r\n" not in request and not self._stop.is_set():
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    request += chunk
                head, _, body = request.partition(b"\r\n\r\n")
                length = _content_length(head)
                while len(body) < length and not self._stop.is_set():  # a POST's form
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    body += chunk
                self.requests += 1
                if self.fault is Fault.SERVE:
                    body = self._bodies().encode()
                    conn.sendall(self._head(200, "text/plain", len(body)) + body)
                elif self.fault is Fault.REDIRECT:
                    head = (
                        f"HTTP/1.1 302 Found\r\nLocation: {self.redirect_to}\r\n"
                        "Content-Length: 0\r\nConnection: close\r\n\r\n"
                    )
                    conn.sendall(head.encode())
                elif self.fault is Fault.DRIP:
                    conn.sendall(self._head(200, "text/plain", 100_000))
                    while not self._stop.is_set() and time.monotonic() < deadline:
                        conn.sendall(b"#")
                        self._stop.wait(self.drip_interval_s)
                elif self.fault is Fault.HUGE:
                    head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                    conn.sendall(head.encode())
                    chunk = b"# filler line of a very large exposition\n" * 1600
                    framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
                    while not self._stop.is_set() and time.monotonic() < deadline:
                        conn.sendall(framed)
                else:  # HANG
                    self._stop.wait(self.max_seconds)
            except OSError:
                return  # the client gave up: expected for every fault

    @staticmethod
    def _head(status: int, content_type: str, length: int) -> bytes:
        return (
            f"HTTP/1.1 {status} OK\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {length}\r\nConnection: close\r\n\r\n"
        ).encode()


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            return int(value.strip())
    return 0
