"""The batch's bookkeeping: one query per cycle for all its deployments, a failure shared (not
retried per deployment), a new batch per cycle, never an old one served late."""

from __future__ import annotations

import threading
from types import MappingProxyType

import pytest

from exporter.base.clock import ManualClock
from exporter.base.errors import FailureReason, PrometheusQueryError, SourceError
from exporter.collector.prom_batch import TAG_LABEL, PrometheusBatch
from exporter.collector.promapi import VectorSample

NAMES = ("a", "b", "c")


class FakeClient:
    """Answers the series query with one series per deployment, tagged as Prometheus would."""

    def __init__(self, fail: bool = False) -> None:
        self.queries: list[tuple[str, float | None]] = []
        self.fail = fail
        self.lock = threading.Lock()

    def query(self, promql: str, *, time_s: float | None = None) -> list[VectorSample]:
        with self.lock:
            self.queries.append((promql, time_s))
        if self.fail:
            raise PrometheusQueryError(
                "http://p", promql, "HTTP 503", reason=FailureReason.HTTP_STATUS
            )
        return [
            VectorSample(
                MappingProxyType({TAG_LABEL: name, "__name__": "vllm:x", "pod": f"{name}-0"}),
                time_s or 0.0,
                float(i),
            )
            for i, name in enumerate(NAMES)
        ]


def batch(client: FakeClient, clock: ManualClock) -> PrometheusBatch:
    return PrometheusBatch(
        client=client,  # type: ignore[arg-type]
        clock=clock,
        selectors={name: f'{{pod=~"{name}-.*"}}' for name in NAMES},
        pod_label="pod",
    )


def test_one_cycle_is_two_queries_and_each_deployment_gets_only_its_series() -> None:
    client, clock = FakeClient(), ManualClock()
    b = batch(client, clock)
    parts = {name: b.part(name) for name in NAMES}
    assert len(client.queries) == 2
    for i, name in enumerate(NAMES):
        (sample,) = parts[name].values
        assert sample.value == float(i) and TAG_LABEL not in sample.labels
        assert parts[name].time_s == clock.time()
    # The next cycle: a deployment asking again starts a new batch.
    clock.advance(30.0)
    assert b.part("b").time_s == clock.time()
    assert len(client.queries) == 4


def test_the_union_tags_every_selector_with_its_deployment() -> None:
    b = batch(FakeClient(), ManualClock())
    for name in NAMES:
        assert f'label_replace({{pod=~"{name}-.*"}}, "{TAG_LABEL}", "{name}"' in b.series_query
    assert b.series_query.count(" or ") == len(NAMES) - 1
    assert b.timestamp_query.startswith(f"max by ({TAG_LABEL}, pod) (timestamp(")


def test_a_failed_query_fails_every_deployment_once_without_a_query_each() -> None:
    client, clock = FakeClient(fail=True), ManualClock()
    b = batch(client, clock)
    errors = []
    for name in NAMES:
        with pytest.raises(SourceError) as err:
            b.part(name)
        errors.append(err.value)
    assert len(client.queries) == 1  # not one per deployment against a Prometheus that is down
    assert all(e.reason is FailureReason.HTTP_STATUS for e in errors)


def test_a_late_reader_never_gets_an_old_batch() -> None:
    client, clock = FakeClient(), ManualClock()
    b = batch(client, clock)
    b.part("a")
    clock.advance(10.0)  # "b" asks long after the batch was read: a fresh one
    assert b.part("b").time_s == clock.time()
    assert len(client.queries) == 4


def test_a_look_back_and_the_read_of_now_are_separate_batches() -> None:
    client, clock = FakeClient(), ManualClock()
    b = batch(client, clock)
    past = clock.time() - 30.0
    # Interleaved as reader threads may run them: still two batches, not four.
    assert b.part("a", past).time_s == past
    assert b.part("a").time_s == clock.time()
    assert b.part("b", past).time_s == past
    assert b.part("b").time_s == clock.time()
    assert [t for _, t in client.queries] == [past, past, clock.time(), clock.time()]


def test_concurrent_readers_share_one_query() -> None:
    client, clock = FakeClient(), ManualClock()
    b = batch(client, clock)
    barrier = threading.Barrier(len(NAMES))
    results = {}

    def read(name: str) -> None:
        barrier.wait()
        results[name] = b.part(name)

    threads = [threading.Thread(target=read, args=(name,)) for name in NAMES]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(client.queries) == 2 and sorted(results) == sorted(NAMES)


def test_an_unknown_deployment_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        batch(FakeClient(), ManualClock()).part("z")
