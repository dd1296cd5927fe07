"""The soak's fake Prometheus answers the daemon's batched read: its Prometheus-mode deployment
finds its pods (before, the fake dropped the batch's deployment tag and the daemon saw none, so
the soak's `duplicated` deployment said `no_pods` for the whole run)."""

from __future__ import annotations

from bench.lib.soak_phases import DuplicatingPrometheus
from exporter.base.clock import SystemClock
from exporter.collector.prom_batch import PrometheusBatch
from exporter.collector.promapi import PrometheusClient
from tests.fixtures.metrics_server import MetricsServer
from tests.fixtures.vllm_exposition import PodTotals
from tests.fixtures.vllm_exposition import render as vllm_text


def test_the_batched_read_finds_both_pods_and_their_scrape_times() -> None:
    servers = [MetricsServer(lambda: vllm_text(PodTotals(), model_name="m")).start()
               for _ in range(2)]  # fmt: skip
    try:
        with DuplicatingPrometheus([s.url for s in servers]) as prometheus:
            batch = PrometheusBatch(
                client=PrometheusClient(prometheus.url), clock=SystemClock(),
                selectors={"duplicated": '{namespace="soak"}'}, pod_label="pod",
            )  # fmt: skip
            part = batch.part("duplicated")
    finally:
        for server in servers:
            server.stop()
    assert {s.labels["pod"] for s in part.values} == {"pod-0", "pod-1"}
    assert {s.labels["pod"] for s in part.stamps} == {"pod-0", "pod-1"}
