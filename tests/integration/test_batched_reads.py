"""Central mode's reads through a real Prometheus: one query for the series of every deployment
and one for their scrape times per cycle, whatever the number of deployments; each deployment
gets exactly its own pods, as a query of its own would give; a bad answer for one deployment (two
series per pod and metric) stays that deployment's, named as before."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import pytest
from prometheus_client import CollectorRegistry

from exporter.base.clock import SystemClock
from exporter.base.errors import FailureReason
from exporter.collector.from_config import build_sources, prometheus_client
from exporter.collector.promapi import PrometheusClient
from exporter.collector.sources import PrometheusSource, SourceRead
from exporter.config.loader import parse_config
from exporter.config.values import Config
from exporter.daemon.daemon import Daemon
from exporter.daemon.operation_metrics import QueryMetrics
from tests.fixtures.metrics_server import MetricsServer
from tests.fixtures.vllm_exposition import PodTotals, render, steady_increment
from tests.integration.prometheus_server import StartPrometheus, Target

pytestmark = pytest.mark.integration

DEPLOYMENTS = 6
PODS = 2
STEP = steady_increment(
    completions=4.0, in_tokens=512, out_tokens=128, ttft_s=0.1, itl_s=0.01,
    inference_s=1.5, running=4.0, waiting=0.0,
)  # fmt: skip


def pod_name(dep: int, pod: int) -> str:
    return f"dep-{dep}-{pod}"


def config_for(url: str, deployments: int) -> Config:
    return parse_config(
        {
            "cycle_period_s": 5,
            "prometheus": {"url": url},
            "deployments": [
                {
                    "name": f"dep-{i}",
                    "model_name": "m",
                    "source": {"prometheus_selector": f'{{namespace="inf", pod=~"dep-{i}-.*"}}'},
                    "slo": {"ttft_ms": 500, "itl_ms": 50},
                }
                for i in range(deployments)
            ],
        }
    )


@pytest.fixture
def pods() -> Iterator[dict[str, MetricsServer]]:
    born = time.time()

    def body(scale: float) -> str:
        return render(PodTotals().plus(STEP, times=scale * (time.time() - born)))

    servers = {
        pod_name(d, p): MetricsServer(partial(body, 1.0 + d + 0.5 * p)).start()
        for d in range(DEPLOYMENTS)
        for p in range(PODS)
    }
    yield servers
    for server in servers.values():
        server.stop()


def targets(pods: dict[str, MetricsServer]) -> list[Target]:
    return [Target(s.url, {"pod": name, "namespace": "inf"}) for name, s in pods.items()]


class Counting:
    """Counts the queries a client sends (the `on_query` hook the daemon's histogram uses)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, seconds: float) -> None:
        assert seconds >= 0.0
        self.count += 1


def read_all(sources: dict[str, PrometheusSource]) -> dict[str, SourceRead]:
    """Every deployment's read on its own thread, as the daemon's cycle runs them."""
    with ThreadPoolExecutor(max_workers=len(sources)) as pool:
        futures = {name: pool.submit(src.read) for name, src in sources.items()}
        return {name: future.result() for name, future in futures.items()}


def test_one_cycle_is_two_queries_for_every_deployment_and_each_gets_its_pods(
    start_prometheus: StartPrometheus, pods: dict[str, MetricsServer]
) -> None:
    prom = start_prometheus(targets(pods), scrape_interval_s=0.5)
    prom.wait_for_scrape(after_s=time.time())
    config = config_for(prom.base_url, DEPLOYMENTS)
    counting = Counting()
    client = prometheus_client(config, on_query=counting)
    sources = build_sources(config, SystemClock(), client)
    assert all(isinstance(s, PrometheusSource) for s in sources.values())
    batched = read_all(sources)  # type: ignore[arg-type]
    assert counting.count == 2  # not 2 x DEPLOYMENTS
    again = read_all(sources)  # type: ignore[arg-type]
    assert counting.count == 4  # the next cycle: two more
    for i in range(DEPLOYMENTS):
        name = f"dep-{i}"
        assert sorted(s.pod for s in batched[name].samples) == [pod_name(i, p) for p in range(PODS)]
        assert batched[name].failures == ()
        # The same values a query of its own gives at the batch's time.
        alone = PrometheusSource(
            client=PrometheusClient(prom.base_url),
            clock=SystemClock(),
            selector=f'{{namespace="inf", pod=~"dep-{i}-.*"}}',
            model_name="m",
        ).read_at(batched[name].time_s)
        assert [(s.pod, s.time_s, s.counters) for s in batched[name].samples] == [
            (s.pod, s.time_s, s.counters) for s in alone.samples
        ]
        assert again[name].time_s > batched[name].time_s


def test_the_daemon_exports_two_queries_per_cycle_for_one_or_six_deployments(
    start_prometheus: StartPrometheus, pods: dict[str, MetricsServer]
) -> None:
    prom = start_prometheus(targets(pods), scrape_interval_s=0.5)
    prom.wait_for_scrape(after_s=time.time())
    per_cycle = {}
    for deployments in (1, DEPLOYMENTS):
        config = config_for(prom.base_url, deployments)
        registry = CollectorRegistry()
        client = prometheus_client(config, on_query=QueryMetrics(registry).observe)
        clock = SystemClock()
        daemon = Daemon(config, build_sources(config, clock, client), registry, clock)
        try:
            daemon.run_cycle()  # the first cycle also reads one period back: two more queries
            first = registry.get_sample_value("vllm_sizer_prometheus_query_seconds_count")
            daemon.run_cycle()
            second = registry.get_sample_value("vllm_sizer_prometheus_query_seconds_count")
        finally:
            daemon.close()
        assert first == 4.0
        per_cycle[deployments] = second - first
        assert registry.get_sample_value("vllm_sizer_prometheus_query_seconds_sum") > 0.0
    assert per_cycle == {1: 2.0, DEPLOYMENTS: 2.0}


def test_two_series_per_pod_fail_that_deployment_only_naming_the_label(
    start_prometheus: StartPrometheus, pods: dict[str, MetricsServer]
) -> None:
    # A second scrape of dep-0-0 (another job, here an extra target label): its counters would
    # be summed with the first copy's and double its load.
    copy = Target(
        pods[pod_name(0, 0)].url, {"pod": pod_name(0, 0), "namespace": "inf", "copy": "1"}
    )
    prom = start_prometheus([*targets(pods), copy], scrape_interval_s=0.5)
    prom.wait_for_scrape(after_s=time.time())
    config = config_for(prom.base_url, DEPLOYMENTS)
    reads = read_all(build_sources(config, SystemClock()))  # type: ignore[arg-type]
    (failure,) = reads["dep-0"].failures
    assert failure.pod == pod_name(0, 0) and failure.reason is FailureReason.BAD_RESPONSE
    assert "differing in copy=" in failure.message, failure.message
    assert [s.pod for s in reads["dep-0"].samples] == [pod_name(0, 1)]
    for i in range(1, DEPLOYMENTS):
        assert reads[f"dep-{i}"].failures == () and len(reads[f"dep-{i}"].samples) == PODS


def test_more_deployments_than_a_batch_holds_take_two_queries_per_batch(
    start_prometheus: StartPrometheus, pods: dict[str, MetricsServer], monkeypatch
) -> None:
    import exporter.collector.from_config as from_config

    monkeypatch.setattr(from_config, "BATCH_DEPLOYMENTS", 4)  # 6 deployments: batches of 4 and 2
    prom = start_prometheus(targets(pods), scrape_interval_s=0.5)
    prom.wait_for_scrape(after_s=time.time())
    config = config_for(prom.base_url, DEPLOYMENTS)
    counting = Counting()
    sources = build_sources(config, SystemClock(), prometheus_client(config, on_query=counting))
    reads = read_all(sources)  # type: ignore[arg-type]
    assert counting.count == 4
    for i in range(DEPLOYMENTS):
        assert sorted(s.pod for s in reads[f"dep-{i}"].samples) == [
            pod_name(i, p) for p in range(PODS)
        ]
