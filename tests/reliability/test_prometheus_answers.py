"""P3, P4, P5, P6: what a Prometheus can answer that no pod said: two series per pod and metric (a
second scrape job), scrape timestamps in the future (a skewed clock), thousands of warnings
and JSON nested deeper than a parser's recursion."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from types import MappingProxyType

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.base.clock import ManualClock
from exporter.base.errors import FailureReason, PrometheusQueryError
from exporter.collector.observations import ObservationStatus, WindowTracker
from exporter.collector.promapi import PrometheusClient, VectorSample
from exporter.collector.sources import PrometheusSource
from tests.fixtures.vllm_exposition import PodTotals, render, steady_increment
from tests.reliability.fault_server import Fault, FaultServer

T0 = 1_700_000_000.0
W = 30.0
STEP = steady_increment(
    completions=60, in_tokens=512, out_tokens=128, ttft_s=0.05, itl_s=0.01,
    queue_s=0.0, inference_s=1.3, running=3, waiting=0, kv_usage=0.1,
)  # fmt: skip


def vector(text: str, pod: str, time_s: float, **extra: str) -> list[VectorSample]:
    return [
        VectorSample(
            MappingProxyType({"__name__": s.name, **s.labels, "pod": pod, **extra}), time_s, s.value
        )  # fmt: skip
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


class FakePrometheus:
    """Answers the source's two queries from `series(time_s)` and `stamp(time_s)`."""

    def __init__(
        self,
        series: Callable[[float], list[VectorSample]],
        stamp: Callable[[float], float],
    ) -> None:
        self.series, self.stamp = series, stamp
        self.timestamp_query = ""

    def query(self, promql: str, *, time_s: float | None = None) -> list[VectorSample]:
        assert time_s is not None
        if promql == self.timestamp_query:
            return [VectorSample(MappingProxyType({"pod": "p0"}), time_s, self.stamp(time_s))]
        return self.series(time_s)


def source(prometheus: FakePrometheus, clock: ManualClock) -> PrometheusSource:
    src = PrometheusSource(client=prometheus, clock=clock, model_name="m")  # type: ignore[arg-type]
    prometheus.timestamp_query = src.timestamp_query
    return src


def totals(time_s: float) -> str:
    return render(PodTotals().plus(STEP, times=1 + (time_s - T0) / W))


def test_two_series_per_pod_and_metric_fail_the_pod_naming_the_labels() -> None:
    """A second scrape job with counters at 1e15 was summed in: one window at 2e15 req/s."""

    def two_jobs(time_s: float) -> list[VectorSample]:
        huge = render(PodTotals().plus(STEP, times=1e13 * (1 + (time_s - T0) / W)))
        return vector(totals(time_s), "p0", time_s, job="vllm") + vector(
            huge, "p0", time_s, job="vllm-copy"
        )

    clock = ManualClock(T0)
    src = source(FakePrometheus(two_jobs, lambda t: t), clock)
    tracker = WindowTracker("d")
    tracker.observe(src.read())
    clock.advance(W)
    read = src.read()
    obs = tracker.observe(read)
    assert read.samples == ()
    assert [f.reason for f in read.failures] == [FailureReason.BAD_RESPONSE]
    message = read.failures[0].message
    assert "job" in message and "vllm-copy" in message, message
    assert obs.arrival_rate_rps == 0.0 and not obs.success


def test_scrape_timestamps_in_the_future_are_warned_and_read_at_the_query_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock(T0)
    prometheus = FakePrometheus(lambda t: vector(totals(t), "p0", t), lambda t: t + 3600.0)
    src = source(prometheus, clock)
    tracker = WindowTracker("d")
    caplog.set_level(logging.WARNING)
    tracker.observe(src.read())
    statuses = []
    for _ in range(3):
        clock.advance(W)
        read = src.read()
        assert all(s.time_s <= read.time_s for s in read.samples)
        statuses.append(tracker.observe(read).status)
    assert statuses == [ObservationStatus.OK] * 3
    future = [r for r in caplog.records if "future" in r.getMessage()]
    assert len(future) == 1, [r.getMessage() for r in caplog.records]


OK_VECTOR = {"status": "success", "data": {"resultType": "vector", "result": []}}


def test_thousands_of_warnings_are_one_short_log_line(caplog: pytest.LogCaptureFixture) -> None:
    """2,000 warnings of 1 KB were one 2 MB WARNING line per query and cycle."""
    body = json.dumps({**OK_VECTOR, "warnings": ["w" * 1024] * 2000})
    caplog.set_level(logging.DEBUG)
    with FaultServer(Fault.SERVE, (body,)) as server:
        client = PrometheusClient(server.url.removesuffix("/metrics"), timeout_s=5.0)
        for _ in range(3):
            assert client.query("up") == []
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and len(lines[0]) < 1000, [len(line) for line in lines]
    assert "2000 warnings" in lines[0]


def test_deeply_nested_json_is_a_bad_response_not_an_internal_error() -> None:
    body = "[" * 200_000 + "]" * 200_000
    with FaultServer(Fault.SERVE, (body,)) as server:
        client = PrometheusClient(server.url.removesuffix("/metrics"), timeout_s=5.0)
        with pytest.raises(PrometheusQueryError) as caught:
            client.query("up")
    assert caught.value.reason is FailureReason.BAD_RESPONSE
    assert "nested" in str(caught.value)
