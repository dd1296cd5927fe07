"""Sources over loopback HTTP: concurrent scrape, failures, name resolution, Prometheus client."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest

from exporter.base.clock import ManualClock
from exporter.base.errors import FailureReason, PrometheusQueryError, ScrapeError
from exporter.collector.promapi import PrometheusClient
from exporter.collector.sources import PrometheusSource, ScrapeSource
from exporter.collector.vllm_metrics import CounterName, GaugeName, SampleStatus
from tests.fixtures.metrics_server import Behaviour, MetricsServer
from tests.fixtures.vllm_exposition import PodTotals, render

T0 = 1_700_000_000.0
# Real HTTP on 127.0.0.1 is the integration marker's business (style §7); these stay fast.
LOOPBACK = pytest.mark.integration


@pytest.fixture
def servers() -> Iterator[list[MetricsServer]]:
    started = [
        MetricsServer(partial(render, PodTotals(success=10.0 * (n + 1), running=n))).start()
        for n in range(3)
    ]
    yield started
    for server in started:
        server.stop()


@LOOPBACK
def test_scrape_reads_every_pod(servers: list[MetricsServer]) -> None:
    source = ScrapeSource(clock=ManualClock(T0), urls=[s.url for s in servers], model_name="m")
    result = source.read()
    assert result.time_s == T0 and result.failures == ()
    assert [s.pod for s in result.samples] == [s.target for s in servers]
    assert [s.counters[CounterName.REQUEST_SUCCESS] for s in result.samples] == [10, 20, 30]
    assert all(s.time_s == T0 and s.status is SampleStatus.OK for s in result.samples)


@LOOPBACK
def test_scrape_failures_are_recorded_not_raised(servers: list[MetricsServer]) -> None:
    servers[0].behaviour = Behaviour.FAIL
    servers[1].behaviour = Behaviour.HANG
    refused = MetricsServer(lambda: "")
    refused_url = refused.url
    refused.stop()  # never started: the port is closed now
    source = ScrapeSource(
        clock=ManualClock(T0), urls=[s.url for s in servers] + [refused_url], timeout_s=1.0
    )
    result = source.read()
    assert [s.pod for s in result.samples] == [servers[2].target]
    reasons = {f.pod: f.reason for f in result.failures}
    assert reasons == {
        servers[0].target: FailureReason.HTTP_STATUS,
        servers[1].target: FailureReason.TIMEOUT,
        refused.target: FailureReason.CONNECTION,
    }


@LOOPBACK
def test_scrape_timeouts_run_concurrently(servers: list[MetricsServer]) -> None:
    for server in servers:
        server.behaviour = Behaviour.HANG
    source = ScrapeSource(clock=ManualClock(T0), urls=[s.url for s in servers], timeout_s=0.5)
    started = time.monotonic()
    result = source.read()
    assert time.monotonic() - started < 1.4  # in series, three 0.5 s timeouts take >= 1.5 s
    assert len(result.failures) == 3 and result.samples == ()


@LOOPBACK
def test_scrape_of_a_non_vllm_endpoint(servers: list[MetricsServer]) -> None:
    servers[0].body = lambda: "# TYPE up gauge\nup 1\n"
    result = ScrapeSource(clock=ManualClock(T0), urls=[servers[0].url]).read()
    # A failed pod, not a sample: its load is then kept by the missing-pod guard.
    assert result.samples == ()
    assert [f.reason for f in result.failures] == [FailureReason.PARSE]
    assert "no vLLM metric" in result.failures[0].message


@LOOPBACK
def test_headless_service_is_resolved_every_cycle(servers: list[MetricsServer]) -> None:
    port = servers[0].port
    answers = [["127.0.0.1"], ["127.0.0.1", "127.0.0.2"]]
    asked: list[tuple[str, int]] = []

    def resolver(host: str, port: int) -> list[str]:
        asked.append((host, port))
        return answers[len(asked) - 1]

    source = ScrapeSource(
        clock=ManualClock(T0),
        service_url=f"http://vllm-headless.ns.svc:{port}/metrics",
        resolver=resolver,
        timeout_s=2.0,
    )
    assert source.targets() == (f"http://127.0.0.1:{port}/metrics",)
    second = source.read()
    assert asked == [("vllm-headless.ns.svc", port)] * 2
    assert [s.pod for s in second.samples] == [f"127.0.0.1:{port}"]
    # 127.0.0.2 is loopback too but nothing listens there on this port.
    assert [f.pod for f in second.failures] == [f"127.0.0.2:{port}"]


@LOOPBACK
def test_real_name_resolution_of_localhost(servers: list[MetricsServer]) -> None:
    source = ScrapeSource(
        clock=ManualClock(T0), service_url=f"http://localhost:{servers[1].port}/metrics"
    )
    result = source.read()
    assert [s.counters[CounterName.REQUEST_SUCCESS] for s in result.samples] == [20.0]


def test_unresolvable_service_raises_scrape_error() -> None:
    def resolver(host: str, port: int) -> list[str]:
        raise OSError("Name or service not known")

    source = ScrapeSource(
        clock=ManualClock(T0), service_url="http://nope:8000/metrics", resolver=resolver
    )
    with pytest.raises(ScrapeError, match="cannot resolve nope") as info:
        source.read()
    assert info.value.reason == "resolve" and info.value.url == "http://nope:8000/metrics"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, r"give exactly one of `urls`"),
        ({"urls": ["http://a/metrics"], "service_url": "http://b/metrics"}, r"exactly one"),
        ({"urls": ["http://a/metrics"], "timeout_s": 0}, r"`timeout_s` must be .* got 0"),
        ({"urls": ["http://a/metrics"], "max_workers": 0}, r"`max_workers` must be .* got 0"),
    ],
)
def test_scrape_source_rejects_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ScrapeSource(clock=ManualClock(T0), **kwargs)


# --- Prometheus HTTP API client, against a scripted loopback server ------------------------


class FakePrometheus:
    """Answers /api/v1/query with `reply(form) -> (status, body)` and records each request."""

    def __init__(self, reply: Callable[[dict[str, str]], tuple[int, str]]) -> None:
        self.reply = reply
        self.requests: list[tuple[dict[str, str], str | None]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                length = int(self.headers.get("Content-Length", "0"))
                raw = parse_qs(self.rfile.read(length).decode())
                form = {k: v[0] for k, v in raw.items()}
                fake.requests.append((form, self.headers.get("Authorization")))
                status, body = fake.reply(form)
                payload = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                del format, args

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5.0)


def vector(*items: tuple[dict[str, str], float, str]) -> str:
    result = [{"metric": m, "value": [t, v]} for m, t, v in items]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}})


@pytest.fixture
def fake_prometheus() -> Iterator[FakePrometheus]:
    fake = FakePrometheus(lambda form: (200, vector()))
    yield fake
    fake.stop()


@LOOPBACK
def test_query_returns_typed_samples_with_nan(fake_prometheus: FakePrometheus) -> None:
    fake_prometheus.reply = lambda form: (
        200,
        vector(({"__name__": "x", "pod": "a"}, 10.5, "1.5"), ({"pod": "b"}, 10.5, "NaN")),
    )
    samples = PrometheusClient(fake_prometheus.url).query("x", time_s=123.4567)
    assert fake_prometheus.requests[0][0] == {"query": "x", "time": "123.457"}
    assert samples[0].labels == {"__name__": "x", "pod": "a"}
    assert (samples[0].time_s, samples[0].value) == (10.5, 1.5)
    assert samples[1].value != samples[1].value  # NaN kept; the caller decides


@LOOPBACK
def test_query_scalar(fake_prometheus: FakePrometheus) -> None:
    body = {"status": "success", "data": {"resultType": "scalar", "result": [5, "2"]}}
    fake_prometheus.reply = lambda form: (200, json.dumps(body))
    [sample] = PrometheusClient(fake_prometheus.url).query("scalar(1)")
    assert (sample.labels, sample.value) == ({}, 2.0)


@LOOPBACK
@pytest.mark.parametrize(
    ("status", "body", "reason"),
    [
        (400, '{"status":"error","errorType":"bad_data","error":"parse error"}', "query"),
        (422, '{"status":"error","errorType":"execution","error":"too many samples"}', "query"),
        (503, "unavailable", "http_status"),
        (200, "not json", "bad_response"),
        (200, '{"status":"success","data":{"resultType":"matrix","result":[]}}', "bad_response"),
        (200, '{"status":"success","data":{"resultType":"vector","result":[{}]}}', "bad_response"),
    ],
)
def test_query_errors_are_prometheus_query_errors(
    fake_prometheus: FakePrometheus, status: int, body: str, reason: str
) -> None:
    fake_prometheus.reply = lambda form: (status, body)
    with pytest.raises(PrometheusQueryError) as info:
        PrometheusClient(fake_prometheus.url).query("up")
    assert info.value.reason == reason and info.value.query == "up"


@LOOPBACK
def test_unreachable_prometheus() -> None:
    fake = FakePrometheus(lambda form: (200, vector()))
    url = fake.url
    fake.stop()
    with pytest.raises(PrometheusQueryError) as info:
        PrometheusClient(url, timeout_s=0.5).query("up")
    assert info.value.reason == FailureReason.CONNECTION


@LOOPBACK
def test_bearer_token_is_reread_and_trimmed(
    fake_prometheus: FakePrometheus, tmp_path: Path
) -> None:
    # Scenarios H6-H8: header form, rotation between requests, empty token = no header.
    token = tmp_path / "token"
    token.write_text("first-token\n")
    client = PrometheusClient(fake_prometheus.url, bearer_token_file=token)
    client.query("up")
    token.write_text("second-token")
    client.query("up")
    token.write_text("")
    client.query("up")
    PrometheusClient(fake_prometheus.url).query("up")
    assert [auth for _, auth in fake_prometheus.requests] == [
        "Bearer first-token",
        "Bearer second-token",
        None,
        None,
    ]


def test_configured_token_file_that_cannot_be_read(tmp_path: Path) -> None:
    client = PrometheusClient("http://127.0.0.1:1", bearer_token_file=tmp_path / "missing")
    with pytest.raises(PrometheusQueryError, match="cannot read bearer token file") as info:
        client.query("up")
    assert info.value.reason == FailureReason.TOKEN


def test_client_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"`base_url` must start with http"):
        PrometheusClient("localhost:9090")
    with pytest.raises(ValueError, match=r"`timeout_s` must be .* got -1"):
        PrometheusClient("http://p", timeout_s=-1)
    with pytest.raises(ValueError, match=r"`insecure` and `ca_file` are exclusive"):
        PrometheusClient("http://p", insecure=True, ca_file=tmp_path / "ca.pem")


# --- Prometheus source over the scripted server --------------------------------------------


@LOOPBACK
def test_prometheus_source_groups_series_by_pod(fake_prometheus: FakePrometheus) -> None:
    now = T0 + 30

    def reply(form: dict[str, str]) -> tuple[int, str]:
        if form["query"].startswith("max by"):
            return 200, vector(({"pod": "a"}, now, str(now - 2)), ({"pod": "b"}, now, str(now - 3)))
        return 200, vector(
            (
                {
                    "__name__": "vllm:request_success_total",
                    "pod": "a",
                    "model_name": "m",
                    "finished_reason": "stop",
                },
                now,
                "7",
            ),
            (
                {
                    "__name__": "vllm:request_success_total",
                    "pod": "a",
                    "model_name": "m",
                    "finished_reason": "length",
                },
                now,
                "3",
            ),
            ({"__name__": "vllm:num_requests_running", "pod": "a", "model_name": "m"}, now, "2"),
            ({"__name__": "vllm:request_success_total", "pod": "b", "model_name": "m"}, now, "4"),
            ({"__name__": "vllm:request_success_total", "model_name": "m"}, now, "99"),
        )

    fake_prometheus.reply = reply
    source = PrometheusSource(
        client=PrometheusClient(fake_prometheus.url),
        clock=ManualClock(now),
        selector='{namespace="ns",pod=~"a|b"}',
        model_name="m",
    )
    result = source.read()
    queries = [form["query"] for form, _ in fake_prometheus.requests]
    assert queries[0].startswith('{__name__=~"') and queries[0].endswith(
        ',namespace="ns",pod=~"a|b"}'
    )
    assert queries[1] == (
        f'max by (pod) (timestamp(label_replace({queries[0]}, "name_", "$1", "__name__", "(.+)")))'
    )
    assert all(form["time"] == f"{now:.3f}" for form, _ in fake_prometheus.requests)
    assert [(s.pod, s.time_s) for s in result.samples] == [("a", now - 2), ("b", now - 3)]
    assert result.samples[0].counters[CounterName.REQUEST_SUCCESS] == 10.0
    assert result.samples[0].gauges[GaugeName.RUNNING] == 2.0
    assert result.samples[1].counters[CounterName.REQUEST_SUCCESS] == 4.0


@LOOPBACK
def test_prometheus_source_drops_stale_pods(fake_prometheus: FakePrometheus) -> None:
    now = T0 + 1000

    def reply(form: dict[str, str]) -> tuple[int, str]:
        if form["query"].startswith("max by"):
            return 200, vector(({"pod": "old"}, now, str(now - 290)))
        return 200, vector(({"__name__": "vllm:request_success_total", "pod": "old"}, now, "1"))

    fake_prometheus.reply = reply
    source = PrometheusSource(client=PrometheusClient(fake_prometheus.url), clock=ManualClock(now))
    result = source.read()
    assert result.samples == ()
    assert [(f.pod, f.reason) for f in result.failures] == [("old", FailureReason.STALE)]


@LOOPBACK
def test_prometheus_source_query_failure_raises(fake_prometheus: FakePrometheus) -> None:
    fake_prometheus.reply = lambda form: (503, "down")
    source = PrometheusSource(client=PrometheusClient(fake_prometheus.url), clock=ManualClock(T0))
    with pytest.raises(PrometheusQueryError):
        source.read()


def test_prometheus_source_rejects_bad_pod_label() -> None:
    with pytest.raises(ValueError, match=r"`pod_label` must be a Prometheus label name"):
        PrometheusSource(
            client=PrometheusClient("http://p"), clock=ManualClock(T0), pod_label="bad-label"
        )
