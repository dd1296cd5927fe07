"""The HTTP server against idle, slow, crowding, hostile and vanishing clients, on real loopback
sockets: it keeps answering, with bounded threads, bounded replies and no tracebacks."""

from __future__ import annotations

import http.client
import json
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, closing
from urllib.parse import quote

import pytest
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from exporter.base.clock import ManualClock
from exporter.base.errors import FailureReason, ScrapeError
from exporter.collector.sources import SourceRead
from exporter.config.values import Config, DeploymentConfig, SloConfig, SourceConfig
from exporter.daemon.daemon import Daemon
from exporter.daemon.server import SizerHTTPServer
from model import ServerConfig, ServiceParams, Workload

pytestmark = pytest.mark.integration  # real HTTP on loopback

LLAMA = ServiceParams(6.68, 2.01e-2, 5.52e-5)
MAX_ERROR_BYTES = 1024


class NoSource:
    """A source that is down: the daemon's one cycle publishes the seeded parameters, and its
    what-if answers from them."""

    def read(self) -> SourceRead:
        raise ScrapeError("http://x:1/", "down in these tests", reason=FailureReason.CONNECTION)


@pytest.fixture
def daemon() -> Iterator[Daemon]:
    dep = DeploymentConfig(
        name="llama", model_name="llama", source=SourceConfig(scrape_urls=("http://x:1/",)),
        server=ServerConfig(), slo=SloConfig(ttft_ms=60.0, itl_ms=20.0), min_replicas=1,
        max_replicas=8, initial_params=LLAMA,
    )  # fmt: skip
    calibrated = Daemon(
        Config(cycle_period_s=30.0, deployments=(dep,)),
        {"llama": NoSource()},
        CollectorRegistry(),
        ManualClock(),
    )
    calibrated.runtimes["llama"].cycle.workload = Workload(512, 128)
    calibrated.run_cycle()
    yield calibrated
    calibrated.close()


def serve(
    registry: CollectorRegistry | None = None,
    predictor: Callable[..., object] | None = None,
    **options: object,
) -> SizerHTTPServer:
    def no_predictor(*_: object) -> object:
        raise LookupError("no deployments")

    server = SizerHTTPServer(
        "127.0.0.1",
        0,
        registry or CollectorRegistry(),
        lambda: True,
        predictor or no_predictor,  # type: ignore[arg-type]
        **options,  # type: ignore[arg-type]
    )
    server.start()
    return server


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as exits:
        yield exits


def started(stack: ExitStack, *args: object, **options: object) -> SizerHTTPServer:
    server = serve(*args, **options)  # type: ignore[arg-type]
    stack.callback(server.stop)
    return server


def request(
    port: int, path: str, method: str = "GET", timeout_s: float = 5.0
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    with closing(conn):
        conn.request(method, path)
        resp = conn.getresponse()
        headers = {k.lower(): v for k, v in resp.getheaders() if k.lower() != "date"}
        return resp.status, headers, resp.read()


def idle_socket(stack: ExitStack, port: int) -> socket.socket:
    sock = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=5.0))
    return sock


def wait_until(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


# -- (1) idle, slow and crowding clients ----------------------------------------------------


def test_idle_connections_are_closed_after_the_timeout(stack: ExitStack) -> None:
    server = started(stack, timeout_s=0.5)
    idle = [idle_socket(stack, server.port) for _ in range(3)]
    start = time.monotonic()
    for sock in idle:
        assert sock.recv(1024) == b""  # the server hung up
    assert time.monotonic() - start < 2.0
    assert request(server.port, "/healthz")[0] == 200


def test_a_client_trickling_its_request_is_cut_off_by_the_deadline(stack: ExitStack) -> None:
    """A byte every 0.2 s never trips a per-read timeout of 0.5 s; the request's deadline does."""
    server = started(stack, timeout_s=0.5)
    sock = idle_socket(stack, server.port)
    start = time.monotonic()
    with pytest.raises(OSError):  # reset or broken pipe once the server has hung up
        for byte in b"GET /healthz HTTP/1.0\r\nX-Padding: " + b"x" * 40:
            sock.sendall(bytes([byte]))
            time.sleep(0.2)
            if time.monotonic() - start > 5.0:
                break
    assert time.monotonic() - start < 2.0


def test_connections_over_the_limit_get_a_quick_503_and_threads_stay_bounded(
    stack: ExitStack,
) -> None:
    """250 idle sockets (what exhausted a 256-file limit) hold at most 64 connection threads
    and the triage's one; a what-if request among them gets a 503 at once, a health probe its
    200; once they go, the what-if is served again."""
    before = threading.active_count()
    server = started(stack)
    idle = [idle_socket(stack, server.port) for _ in range(250)]
    assert wait_until(lambda: threading.active_count() - before <= 64 + 2, 2.0), (
        threading.active_count() - before
    )
    for _ in range(5):  # each request is sent before the 503 arrives: none is reset
        start = time.monotonic()
        status, headers, body = request(server.port, "/api/v1/predict?deployment=x&rate=1")
        assert (status, body) == (503, b"too many connections\n")
        assert headers["server"] == "vllm-sizer"
        assert time.monotonic() - start < 1.0
        assert request(server.port, "/healthz")[0] == 200
        assert time.monotonic() - start < 1.0
    for sock in idle:
        sock.close()
    assert wait_until(
        lambda: request(server.port, "/api/v1/predict?deployment=x&rate=1")[0] == 404, 5.0
    )


def test_a_burst_of_connections_waits_in_the_listen_backlog(stack: ExitStack) -> None:
    """The server is not accepting yet: the kernel must hold 100 connections for it (a backlog of
    5 refuses, by silence, every one after the sixth)."""
    server = SizerHTTPServer("127.0.0.1", 0, CollectorRegistry(), lambda: True, lambda *_: None)  # type: ignore[arg-type,return-value]
    burst = []
    for _ in range(100):
        burst.append(stack.enter_context(socket.create_connection(("127.0.0.1", server.port), 0.5)))
    server.start()
    stack.callback(server.stop)
    burst[0].sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
    assert burst[0].recv(1024).startswith(b"HTTP/1.0 200")


# -- (2) every malformed what-if parameter is a short 400 that names it ---------------------


@pytest.mark.parametrize(
    ("query", "parameter", "says"),
    [
        ("deployment=llama&rate=1&replicas=\u2460", "replicas", "10000"),  # isdigit(), not int()
        ("deployment=llama&rate=1&replicas=\u0663", "replicas", "10000"),  # Arabic-Indic three
        ("deployment=llama&rate=1&replicas=" + "7" * 5000, "replicas", "10000"),
        ("deployment=llama&rate=1&replicas=10001", "replicas", "10000"),
        ("deployment=llama&rate=1&replicas=-3", "replicas", "10000"),
        ("deployment=llama&rate=1e308", "rate", "1e+06"),
        ("deployment=llama&rate=" + "9" * 5000, "rate", "1e+06"),
        ("deployment=llama&rate=1e99999", "rate", "1e+06"),
        ("deployment=llama&rate=inf", "rate", "1e+06"),
        ("deployment=llama&rate=nan", "rate", "1e+06"),
        ("deployment=llama&rate=\uff11", "rate", "1e+06"),  # fullwidth 1: float() takes it
        ("deployment=llama&rate=", "rate", "1e+06"),
        ("deployment=" + "d" * 5000 + "&rate=1", "deployment", "253"),
        ("deployment=llama&rate=1&" + "k" * 5000 + "=1", "k" * 40 + "...", "unknown"),
    ],
)
def test_a_malformed_parameter_gets_a_short_400_naming_it(
    stack: ExitStack, daemon: Daemon, query: str, parameter: str, says: str
) -> None:
    server = started(stack, predictor=daemon.predict)
    status, headers, body = request(server.port, "/api/v1/predict?" + quote(query, safe="=&"))
    assert status == 400, body[:200]
    assert headers["content-type"] == "application/json"
    assert len(body) < MAX_ERROR_BYTES
    error = json.loads(body)
    assert error["parameter"] == parameter
    assert says in error["error"]


@pytest.mark.parametrize("rate", ["5e-324", "1e-300", "0", "0.0", "1e6"])
def test_tiny_and_largest_rates_get_an_answer(stack: ExitStack, daemon: Daemon, rate: str) -> None:
    server = started(stack, predictor=daemon.predict)
    status, _, body = request(server.port, f"/api/v1/predict?deployment=llama&rate={rate}")
    assert status == 200, body[:200]
    answer = json.loads(body)
    assert answer["rate_requests_per_second"] == float(rate)
    assert answer["replicas_needed"] >= 1


def test_a_model_failure_is_a_500_with_a_body(stack: ExitStack) -> None:
    def broken(*_: object) -> object:
        raise ZeroDivisionError("model bug")

    server = started(stack, predictor=broken)
    status, _, body = request(server.port, "/api/v1/predict?deployment=llama&rate=1")
    assert status == 500 and "error" in json.loads(body)


# -- (3) HEAD, (4) the Server header, (6b) liveness -----------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/metrics",
        "/healthz",
        "/readyz",
        "/api/v1/predict?deployment=llama&rate=2",
        "/api/v1/predict?deployment=llama&rate=x",
        "/api/v1/predict?deployment=nope&rate=2",
        "/nowhere",
    ],
)
def test_head_answers_like_get_without_a_body(stack: ExitStack, daemon: Daemon, path: str) -> None:
    registry = CollectorRegistry()
    Gauge("some_gauge", "A gauge.", registry=registry).set(3)
    server = started(stack, registry, predictor=daemon.predict)
    get_status, get_headers, get_body = request(server.port, path)
    head_status, head_headers, head_body = request(server.port, path, method="HEAD")
    assert (head_status, head_headers) == (get_status, get_headers)
    assert head_body == b""
    assert int(get_headers["content-length"]) == len(get_body) > 0


def test_the_server_header_names_no_runtime(stack: ExitStack) -> None:
    server = started(stack)
    for path in ("/healthz", "/nowhere"):
        assert request(server.port, path)[1]["server"] == "vllm-sizer"
    with closing(socket.create_connection(("127.0.0.1", server.port), 5.0)) as sock:
        sock.sendall(b"DELETE /metrics HTTP/1.0\r\n\r\n")  # http.server's own error reply
        reply = sock.recv(4096)
    assert b"Server: vllm-sizer\r\n" in reply and b"Python" not in reply


def test_healthz_fails_when_the_sizer_is_not_alive(stack: ExitStack) -> None:
    alive = True
    server = started(stack, live=lambda: alive)
    assert request(server.port, "/healthz")[0] == 200
    alive = False
    status, _, body = request(server.port, "/healthz")
    assert status == 503 and b"no cycle started" in body
    assert request(server.port, "/healthz", method="HEAD")[0] == 503


# -- (5) clients that vanish ----------------------------------------------------------------


class BlockingCollector(Collector):
    """/metrics waits here until the test has reset the connection, then sends ~2 MB."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self.entered.set()
        self.release.wait(5.0)
        family = GaugeMetricFamily("big", "A large family.", labels=["i"])
        for i in range(20_000):
            family.add_metric([f"{i:080d}"], i)
        yield family


def reset(sock: socket.socket) -> None:
    """Close with an RST, as a client that crashed or timed out does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


@pytest.mark.parametrize("when", ["writing", "reading"])
def test_a_client_that_vanishes_prints_no_traceback(
    stack: ExitStack, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, when: str
) -> None:
    collector = BlockingCollector()
    registry = CollectorRegistry()
    registry.register(collector)
    server = started(stack, registry)
    baseline = threading.active_count()
    sock = socket.create_connection(("127.0.0.1", server.port), 5.0)
    if when == "writing":
        sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        assert collector.entered.wait(5.0)
        reset(sock)
        collector.release.set()
    else:
        sock.sendall(b"GET /metr")
        time.sleep(0.1)
        reset(sock)
    assert wait_until(lambda: threading.active_count() <= baseline, 5.0)
    assert request(server.port, "/healthz")[0] == 200
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception" not in err, err
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
