"""The daemon's one HTTP server: /metrics, /healthz, /readyz and /api/v1/predict.

Binds only to the configured address; no endpoint changes state. JSON uses seconds
(units are converted only here and in exposition.py).

The server must outlive whatever connects to it (the same port answers the kubelet's probes
and Prometheus): a connection gets one thread and at most `timeout_s` to send its request, at
most `max_connections` are served at once, and every query parameter is bounded, so no client
can use up the process's threads or files. A connection over the limit waits for its request on
one shared thread (exporter.daemon.http_triage): /healthz, /readyz and /metrics are then served
on threads kept for them, anything else is answered 503.
"""

from __future__ import annotations

import io
import json
import logging
import math
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from exporter.daemon.http_triage import Triage
from exporter.sizing.what_if import MAX_PERCENTILE, MIN_PERCENTILE, WhatIf

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

logger = logging.getLogger(__name__)


DEFAULT_TIMEOUT_S = 10.0  # to send a request, and again to take the reply
DEFAULT_MAX_CONNECTIONS = 64
# Connections the kernel holds while the accepting thread catches up (a burst of probes and
# scrapes after a restart); Linux caps it at net.core.somaxconn.
LISTEN_BACKLOG = 128

# Query bounds: beyond them a what-if means nothing, and the reply must stay small.
MAX_REPLICAS = 10_000
MAX_RATE_RPS = 1e6
MAX_DEPLOYMENT_CHARS = 253  # a Kubernetes object name's limit
SHOWN_CHARS = 40  # of a bad value, in its error
_REPLICAS = re.compile(r"[0-9]{1,5}")  # ASCII only: str.isdigit() takes "①", which int() refuses
_RATE = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,4})?")
MAX_PERCENTILES = 8  # asked in one query
_PERCENTILE = re.compile(r"[0-9]{1,2}(?:\.[0-9])?")


class QueryError(ValueError):
    """A bad query parameter; `parameter` names it."""

    def __init__(self, parameter: str, message: str) -> None:
        self.parameter = parameter
        super().__init__(f"query parameter `{parameter}`: {message}")


# (deployment, total rate req/s, replicas or None = current, quantiles asked) -> WhatIf; raises
# QueryError or LookupError (unknown deployment / no parameters yet).
Predictor = Callable[[str, float, int | None, tuple[float, ...]], WhatIf]
PredictQuery = tuple[str, float, int | None, tuple[float, ...]]
# (model, total rate req/s) -> the cheapest mix of its variants (exporter.sizing.fleet_whatif);
# raises LookupError (unknown model, no plan yet).
MixPredictor = Callable[[str, float], "JsonAnswer"]


class JsonAnswer(Protocol):
    def to_json(self) -> dict[str, Any]: ...


def _cut(raw: str) -> str:
    """`raw`, cut to SHOWN_CHARS for an error message."""
    return raw if len(raw) <= SHOWN_CHARS else raw[:SHOWN_CHARS] + "..."


def parse_predict_query(query: str) -> PredictQuery:
    """deployment, rate (req/s, 0 to MAX_RATE_RPS), optional replicas (1 to MAX_REPLICAS) and
    optional percentiles (`95,99.9` -> quantiles 0.95, 0.999) from a query string."""
    params = parse_qs(query, keep_blank_values=True)
    for name, values in params.items():
        if name not in ("deployment", "rate", "replicas", "percentiles"):
            raise QueryError(
                _cut(name), "unknown (allowed: deployment, rate, replicas, percentiles)"
            )
        if len(values) != 1:
            raise QueryError(name, "given more than once")
    deployment = params.get("deployment", [""])[0]
    if not deployment:
        raise QueryError("deployment", "is required")
    if len(deployment) > MAX_DEPLOYMENT_CHARS:
        raise QueryError("deployment", f"must be at most {MAX_DEPLOYMENT_CHARS} characters")
    if "rate" not in params:
        raise QueryError("rate", "is required (requests per second)")
    rate = _rate(params["rate"][0], "must be")
    replicas: int | None = None
    if "replicas" in params:
        raw = params["replicas"][0]
        replicas = int(raw) if _REPLICAS.fullmatch(raw) else 0
        if not 1 <= replicas <= MAX_REPLICAS:
            raise QueryError(
                "replicas", f"must be an integer from 1 to {MAX_REPLICAS}, got {_cut(raw)!r}"
            )
    return deployment, rate, replicas, _percentiles(params.get("percentiles", [""])[0])


def parse_mix_query(query: str) -> tuple[str, float]:
    """model (a `models` entry's name) and rate (req/s) of a cheapest-mix query."""
    params = parse_qs(query, keep_blank_values=True)
    for name, values in params.items():
        if name not in ("model", "rate"):
            raise QueryError(_cut(name), "unknown with `model` (allowed: model, rate)")
        if len(values) != 1:
            raise QueryError(name, "given more than once")
    model = params["model"][0]
    if not model or len(model) > MAX_DEPLOYMENT_CHARS:
        raise QueryError("model", f"must be a model name of 1 to {MAX_DEPLOYMENT_CHARS} characters")
    return model, _rate(params.get("rate", [""])[0], "is required:")


def _percentiles(raw: str) -> tuple[float, ...]:
    """Quantiles from `95,99.9`: distinct, in order, at most MAX_PERCENTILES."""
    if not raw:
        return ()
    parts = raw.split(",", MAX_PERCENTILES)
    values = [float(p) if _PERCENTILE.fullmatch(p) else math.nan for p in parts]
    if len(parts) > MAX_PERCENTILES or not all(
        MIN_PERCENTILE <= v <= MAX_PERCENTILE for v in values
    ):
        raise QueryError(
            "percentiles",
            f"must be up to {MAX_PERCENTILES} comma-separated percentiles from "
            f"{MIN_PERCENTILE:g} to {MAX_PERCENTILE:g} (one decimal at most), got {_cut(raw)!r}",
        )
    return tuple(round(v / 100.0, 4) for v in sorted(set(values)))


def _always_alive() -> bool:
    return True


class SizerHTTPServer:
    """Serves the registry and the daemon's health and what-if API on one address.

    /healthz answers 503 when `live()` is false (default: always alive, for a caller that runs
    its cycles itself); /readyz when `ready()` is false.
    """

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        ready: Callable[[], bool],
        predictor: Predictor,
        *,
        live: Callable[[], bool] = _always_alive,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        mix: MixPredictor | None = None,
    ) -> None:
        """`mix` answers `/api/v1/predict?model=...&rate=...` (None: such a query is a 404)."""
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"`timeout_s` must be a finite number > 0, got {timeout_s}")
        if max_connections < 1:
            raise ValueError(f"`max_connections` must be >= 1, got {max_connections}")
        handler = _handler_class(registry, ready, live, predictor, timeout_s, mix)
        self._httpd = _BoundedServer((host, port), handler, max_connections)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        self._httpd.triage.start()
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="vllm-sizer-http", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


CONNECTION_THREAD = "vllm-sizer-http-connection"


class _BoundedServer(ThreadingHTTPServer):
    """A thread per connection, at most `max_connections` of them; the next ones go to the
    triage, which serves the sizer's health and metrics on reserved threads."""

    daemon_threads = True  # a connection still open at shutdown does not hold up the exit
    request_queue_size = LISTEN_BACKLOG

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        max_connections: int,
    ) -> None:
        self._slots = threading.BoundedSemaphore(max_connections)
        self._heads: dict[socket.socket, bytes] = {}  # read by the triage, for the handler
        self._heads_lock = threading.Lock()
        # Before the bind: a failed bind closes the server, triage included.
        self.triage = Triage(self._serve_priority, max_pending=max_connections)
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.triage.add(request, client_address)
            return
        self._start(request, client_address, self._slots.release)

    def _serve_priority(self, request: socket.socket, client_address: Any, head: bytes) -> None:
        with self._heads_lock:
            self._heads[request] = head
        self._start(request, client_address, self.triage.release)

    def taken_head(self, request: socket.socket) -> bytes:
        """What the triage already read of `request` (b"" for a connection served at once)."""
        with self._heads_lock:
            return self._heads.pop(request, b"")

    def _start(self, request: Any, client_address: Any, release: Callable[[], None]) -> None:
        try:
            threading.Thread(
                target=self._serve_then_release,
                args=(request, client_address, release),
                name=CONNECTION_THREAD,
                daemon=True,
            ).start()
        except BaseException:
            release()
            raise

    def _serve_then_release(
        self, request: Any, client_address: Any, release: Callable[[], None]
    ) -> None:
        try:
            self.process_request_thread(request, client_address)
        finally:
            with self._heads_lock:
                self._heads.pop(request, None)
            release()

    def server_close(self) -> None:
        super().server_close()
        self.triage.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Called inside the `except` of a failed connection: a client that went away is
        routine (a probe's timeout, a closed browser tab), anything else a logged bug; neither
        is printed to stderr, as socketserver would."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError):
            logger.debug("http: %s went away: %s", client_address, exc)
        else:
            logger.exception("http: serving %s failed", client_address)


class _DeadlineReader(io.RawIOBase):
    """A connection's bytes, each recv given only what is left of one deadline: a client that
    sends its request a byte at a time never trips a per-recv timeout, but cannot hold its
    connection (and thread) past the deadline."""

    def __init__(self, sock: socket.socket, deadline_s: float, head: bytes = b"") -> None:
        super().__init__()
        self._sock = sock
        self._deadline_s = deadline_s
        self._head = memoryview(head)  # bytes already read from the socket, returned first

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        if self._head:
            out = memoryview(buffer).cast("B")
            n = min(len(out), len(self._head))
            out[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        left_s = self._deadline_s - time.monotonic()  # real time, as socket timeouts are
        if left_s <= 0:
            raise TimeoutError("request not received in time")
        self._sock.settimeout(left_s)
        return self._sock.recv_into(buffer)


def _handler_class(
    registry: CollectorRegistry,
    ready: Callable[[], bool],
    live: Callable[[], bool],
    predictor: Predictor,
    timeout_s: float,
    mix: MixPredictor | None = None,
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "vllm-sizer"
        timeout = timeout_s  # http.server drops a connection whose read or write times out
        with_body = True  # False for HEAD: the same status and headers, no body

        def version_string(self) -> str:
            # The name alone: http.server would add the Python version, a hint for attackers.
            return self.server_version

        def setup(self) -> None:
            super().setup()
            # The request is read through the deadline; the plain reader is closed, else its
            # reference would keep the socket open after the connection ends.
            self.rfile.close()
            head = self.server.taken_head(self.connection)  # type: ignore[attr-defined]
            self.rfile = io.BufferedReader(
                _DeadlineReader(self.connection, time.monotonic() + timeout_s, head)
            )

        def do_HEAD(self) -> None:  # noqa: N802 (http.server's naming)
            self.with_body = False
            self.do_GET()

        def do_GET(self) -> None:  # noqa: N802
            url = urlsplit(self.path)
            if url.path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif url.path == "/healthz":
                if live():
                    self._text(200, "ok\n")
                else:
                    self._text(503, "not alive: no cycle started recently\n")
            elif url.path == "/readyz":
                if ready():
                    self._text(200, "ready\n")
                else:
                    self._text(503, "not ready: no successful cycle recently\n")
            elif url.path == "/api/v1/predict":
                self._predict(url.query)
            else:
                self._json(404, {"error": f"no such endpoint: {_cut(url.path)}"})

        def _predict(self, query: str) -> None:
            try:
                result: JsonAnswer
                if "model" in parse_qs(query, keep_blank_values=True):
                    if mix is None:
                        raise LookupError("no `models` section: no fleet plan to answer from")
                    result = mix(*parse_mix_query(query))
                else:
                    result = predictor(*parse_predict_query(query))
            except QueryError as exc:
                self._json(400, {"error": str(exc), "parameter": exc.parameter})
            except LookupError as exc:
                self._json(404, {"error": str(exc.args[0] if exc.args else exc)})
            except Exception:  # a what-if the model cannot answer still gets a reply
                logger.exception("what-if %s failed", _cut(query))
                self._json(500, {"error": "internal error: the model could not answer"})
            else:
                self._json(200, result.to_json())

        def _text(self, status: int, body: str) -> None:
            self._send(status, body.encode(), "text/plain; charset=utf-8")

        def _json(self, status: int, body: dict[str, Any]) -> None:
            self._send(status, json.dumps(body).encode(), "application/json")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            # The reply gets the whole timeout again, whatever reading the request left of it.
            self.connection.settimeout(timeout_s)
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.with_body:
                self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            logger.debug("http: " + format, *args)

    return Handler


def _rate(raw: str, lead: str) -> float:
    """The `rate` parameter (req/s), or QueryError whose message starts with `lead`. A float
    that overflows is inf, and one that underflows is 0 or denormal: both in the range check
    or answered as the tiny rate they are."""
    rate = float(raw) if _RATE.fullmatch(raw) else math.nan
    if not 0 <= rate <= MAX_RATE_RPS:
        raise QueryError(
            "rate",
            f"{lead} a decimal number from 0 to {MAX_RATE_RPS:g} (requests per second), "
            f"got {_cut(raw)!r}",
        )
    return rate
