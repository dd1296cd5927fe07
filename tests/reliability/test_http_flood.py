"""H7: the sizer's health and its own /metrics are served while other clients hold every
connection. The flood comes from loopback, where every client shares one address, so nothing
may tell the prober from the flood but what it asks for."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, closing, suppress

import pytest
from prometheus_client import CollectorRegistry

from exporter.daemon.server import SizerHTTPServer

pytestmark = pytest.mark.integration  # real HTTP on loopback


def no_predictor(*_: object) -> object:
    raise LookupError("no deployments")


@pytest.fixture
def server() -> Iterator[SizerHTTPServer]:
    served = SizerHTTPServer(
        "127.0.0.1", 0, CollectorRegistry(), lambda: True, no_predictor,  # type: ignore[arg-type]
        timeout_s=3.0, max_connections=16,
    )  # fmt: skip
    served.start()
    yield served
    served.stop()


def get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5.0)
    with closing(conn):
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()


def reconnecting_client(port: int, stop: threading.Event) -> None:
    """Connects, sends nothing, and reconnects as soon as the server lets go."""
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
                while not stop.is_set():
                    with suppress(TimeoutError):
                        if sock.recv(1024) == b"":
                            break
        except OSError:
            time.sleep(0.01)


def test_health_and_metrics_are_served_while_a_flood_holds_every_connection(
    server: SizerHTTPServer,
) -> None:
    """80 clients (five times the connection limit) reconnecting in a loop: every probe of
    /healthz, /readyz and /metrics gets its 200 within a second; the what-if API may be
    refused (503), never left hanging."""
    stop = threading.Event()
    flood = [
        threading.Thread(target=reconnecting_client, args=(server.port, stop), daemon=True)
        for _ in range(80)
    ]
    with ExitStack() as exits:
        exits.callback(lambda: [t.join(timeout=5) for t in flood])
        exits.callback(stop.set)
        for thread in flood:
            thread.start()
        time.sleep(1.0)  # the flood holds every slot
        statuses = []
        for k in range(30):
            path = ("/healthz", "/readyz", "/metrics")[k % 3]
            start = time.monotonic()
            status, _ = get(server.port, path)
            statuses.append((path, status, round(time.monotonic() - start, 2)))
            time.sleep(0.1)
        assert all(status == 200 and took < 1.0 for _, status, took in statuses), statuses
        start = time.monotonic()
        status, body = get(server.port, "/api/v1/predict?deployment=x&rate=1")
        assert status in (503, 404), (status, body)
        assert time.monotonic() - start < 1.0
