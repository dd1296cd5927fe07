"""Three shards over 100 deployments through a real Prometheus: each deployment is answered once
(by its shard, under that shard's replica label), and each shard's cycle costs two queries
whatever its number of deployments."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import requests
from prometheus_client import CollectorRegistry, generate_latest

from exporter.base.clock import SystemClock
from exporter.collector.from_config import build_sources, prometheus_client
from exporter.config.loader import parse_config
from exporter.config.topology import REPLICA_ENV, place, shard_of
from exporter.daemon.daemon import Daemon
from exporter.daemon.operation_metrics import QueryMetrics
from exporter.daemon.replica_label import register_start, served_registry
from tests.fixtures.metrics_server import MetricsServer
from tests.fixtures.vllm_exposition import PodTotals, render, steady_increment
from tests.integration.prometheus_server import StartPrometheus, Target

pytestmark = pytest.mark.integration

DEPLOYMENTS = 100
SHARDS = 3
STEP = steady_increment(
    completions=4.0, in_tokens=512, out_tokens=128, ttft_s=0.1, itl_s=0.01,
    inference_s=1.5, running=4.0, waiting=0.0,
)  # fmt: skip
QUERIES = "vllm_sizer_prometheus_query_seconds_count"


def model(i: int) -> str:
    return f"org/model-{i}"


@pytest.fixture
def vllm() -> Iterator[MetricsServer]:
    born = time.time()
    server = MetricsServer(
        lambda: render(PodTotals().plus(STEP, times=1.0 + time.time() - born), model_name="any")
    ).start()
    yield server
    server.stop()


def instant(base_url: str, query: str) -> list[dict]:
    answer = requests.post(f"{base_url}/api/v1/query", data={"query": query}, timeout=10).json()
    assert answer["status"] == "success", answer
    return list(answer["data"]["result"])


def test_three_shards_answer_each_of_100_deployments_once_with_two_queries_per_cycle(
    start_prometheus: StartPrometheus, vllm: MetricsServer
) -> None:
    # One fake pod per deployment, each serving a model of its own: the same endpoint scraped as
    # 100 targets; the target's model_name label replaces the scraped one (honor_labels false).
    pods = [
        Target(vllm.url, {"pod": f"dep-{i}-0", "namespace": "inf", "model_name": model(i)})
        for i in range(DEPLOYMENTS)
    ]
    prom = start_prometheus(pods, scrape_interval_s=1.0)
    prom.wait_for_scrape(after_s=time.time())
    config = parse_config(
        {
            "cycle_period_s": 5,
            "prometheus": {"url": prom.base_url},
            "shard": {"count": SHARDS},
            "deployments": [
                {
                    "name": f"dep-{i}",
                    "model_name": model(i),
                    "source": {"prometheus_selector": f'{{namespace="inf", pod="dep-{i}-0"}}'},
                    "slo": {"ttft_ms": 500, "itl_ms": 50},
                }
                for i in range(DEPLOYMENTS)
            ],
        }
    )
    sizers: list[MetricsServer] = []
    per_cycle: list[float] = []
    owner: dict[str, str] = {}
    try:
        for ordinal in range(SHARDS):
            mine, replica = place(config, {REPLICA_ENV: f"vllm-sizer-{ordinal}"})
            assert replica is not None
            owner.update(dict.fromkeys((d.name for d in mine.deployments), replica))
            registry = CollectorRegistry()
            register_start(registry, time.time())
            client = prometheus_client(mine, on_query=QueryMetrics(registry).observe)
            clock = SystemClock()
            daemon = Daemon(mine, build_sources(mine, clock, client), registry, clock)
            try:
                daemon.run_cycle()
                first = registry.get_sample_value(QUERIES)
                daemon.run_cycle()
                per_cycle.append(registry.get_sample_value(QUERIES) - first)
            finally:
                daemon.close()
            served = served_registry(registry, replica)
            sizers.append(MetricsServer(lambda r=served: generate_latest(r).decode()).start())
        # Two queries per cycle and shard, for 100 / 3 deployments each.
        assert per_cycle == [2.0] * SHARDS
        assert sorted(owner) == sorted(f"dep-{i}" for i in range(DEPLOYMENTS))
        sizer_targets = [Target(s.url, {"job_role": "sizer"}) for s in sizers]
        prom.set_targets([*pods, *sizer_targets])
        deadline = time.time() + 30.0
        answers: list[dict] = []
        while time.time() < deadline:
            answers = instant(prom.base_url, "vllm_sizer_desired_replicas")
            if len(answers) >= DEPLOYMENTS:
                break
            time.sleep(0.5)
        # Each deployment answered once, by the replica of the shard its model hashes to.
        got = sorted((a["metric"]["deployment"], a["metric"]["sizer_replica"]) for a in answers)
        assert got == sorted(owner.items())
        for i in range(DEPLOYMENTS):
            assert owner[f"dep-{i}"] == f"vllm-sizer-{shard_of(model(i), SHARDS)}"
    finally:
        for sizer in sizers:
            sizer.stop()
