"""The shipped PromQL, evaluated by a real Prometheus server scraping stand-in sizers.

Four stubs export every series of the daemon for one deployment the way sidecar mode does:
three live copies recommending 5 replicas at calibration confidence 0.9 and one frozen copy
(last successful cycle 10 minutes ago) still exporting 9. A second deployment has only frozen
copies (one of them at low confidence). A third has two live copies whose confidence is 0.3
(their gauge is then the sizer's hand-over count, 7), and two vLLM pods holding 100 + 30 and
60 + 10 running + waiting requests, which the queries must not read. Prometheus (Debian's
package, on loopback) scrapes them twice a second; the tests query its HTTP API with the exact
strings from the manifests and the dashboard.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from prometheus_client import CollectorRegistry

import tests.integration.prometheus_server as prometheus_server
from exporter.daemon.exposition import ENUM_GAUGES, PREFIX
from tests.ecosystem.dashboard import EXPORTED_METRICS, panel_queries
from tests.ecosystem.manifests import find
from tests.ecosystem.sizer_stub import SizerValues, StubCollector, StubSizer
from tests.fixtures.metrics_server import MetricsServer

pytestmark = pytest.mark.integration

LIVE_DESIRED = 5
FROZEN_DESIRED = 9
LIVE_COPIES = 3
FROZEN_DEPLOYMENT = "frozen-vllm"
UNSURE_DEPLOYMENT = "unsure-vllm"  # a live sizer whose calibration it does not trust
UNSURE_DESIRED = 7  # its hand-over count
UNSURE_PODS = ((100.0, 30.0), (60.0, 10.0))  # running, waiting


@pytest.fixture(scope="module")
def stubs() -> Iterator[list[StubSizer]]:
    frozen = 600.0
    made = [StubSizer(SizerValues(desired_replicas=LIVE_DESIRED)) for _ in range(LIVE_COPIES)]
    made.append(StubSizer(SizerValues(desired_replicas=FROZEN_DESIRED, last_success_age_s=frozen)))
    made.append(StubSizer(SizerValues(deployment=FROZEN_DEPLOYMENT, last_success_age_s=frozen)))
    low = SizerValues(deployment=FROZEN_DEPLOYMENT, last_success_age_s=frozen)
    low.per_deployment["calibration_confidence"] = 0.2
    made.append(StubSizer(low))
    for _ in range(2):
        unsure = SizerValues(deployment=UNSURE_DEPLOYMENT, desired_replicas=UNSURE_DESIRED)
        unsure.per_deployment["calibration_confidence"] = 0.3
        made.append(StubSizer(unsure))
    yield made
    with ThreadPoolExecutor(len(made)) as pool:  # each shutdown waits up to 0.5 s for its loop
        list(pool.map(StubSizer.close, made))


def vllm_gauges(pod: str, running: float, waiting: float) -> str:
    """A vLLM pod's request gauges in the text format (the names keep their colon)."""
    return (
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{pod="{pod}"}} {running}\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{pod="{pod}"}} {waiting}\n'
    )


@pytest.fixture(scope="module")
def vllm_pods() -> Iterator[list[MetricsServer]]:
    """The unsure deployment's two vLLM pods."""
    pods = [
        MetricsServer(lambda k=k, r=r, w=w: vllm_gauges(f"{UNSURE_DEPLOYMENT}-{k}", r, w)).start()
        for k, (r, w) in enumerate(UNSURE_PODS)
    ]
    yield pods
    for pod in pods:
        pod.stop()


@pytest.fixture(scope="module")
def prometheus(stubs, vllm_pods, tmp_path_factory) -> Iterator[str]:
    """A Prometheus scraping every stub each 0.5 s; its base URL once two rounds are in."""
    workdir: Path = tmp_path_factory.mktemp("prometheus")
    # The namespace label is what the PodMonitor's target labels give in a cluster.
    targets = [
        prometheus_server.Target(f"http://{s.address}/metrics", labels={"namespace": "inference"})
        for s in stubs
    ] + [prometheus_server.Target(pod.url, labels={"namespace": "inference"}) for pod in vllm_pods]
    server = prometheus_server.PrometheusServer(targets, workdir=workdir, scrape_interval_s=0.5)
    try:
        server.start()
        server.wait_for_scrape(after_s=time.time())
        server.wait_for_scrape(after_s=time.time())  # two samples per series for rate()
        yield server.base_url
    finally:
        server.stop()


def instant(url: str, query: str) -> list[dict[str, Any]]:
    """An instant query through Prometheus' HTTP API; the result vector."""
    response = requests.post(f"{url}/api/v1/query", data={"query": query}, timeout=5)
    body = response.json()
    assert response.status_code == 200 and body["status"] == "success", body
    assert body["data"]["resultType"] == "vector"
    return list(body["data"]["result"])


def trigger_query() -> str:
    return str(find("ScaledObject", "llama-8b-vllm")["spec"]["triggers"][0]["metadata"]["query"])


def keda_average_value(value: float, threshold: float) -> int:
    """The HPA's AverageValue rule for KEDA's external metric (tolerance 0)."""
    return math.ceil(value / threshold)


def keda_value(value: float, threshold: float, current: int) -> int:
    """The HPA's Value rule: the ratio applied to the current replica count."""
    return math.ceil(value / threshold * current)


def test_trigger_returns_the_live_recommendation_as_one_element(prometheus) -> None:
    result = instant(prometheus, trigger_query())
    assert len(result) == 1  # KEDA's prometheus scaler needs a single element
    assert float(result[0]["value"][1]) == LIVE_DESIRED  # the frozen copy's 9 is ignored


@pytest.mark.parametrize("current", range(1, 9))
def test_average_value_lands_on_the_recommendation_whatever_the_current_count(
    prometheus, current
) -> None:
    (sample,) = instant(prometheus, trigger_query())
    value = float(sample["value"][1])
    trig = find("ScaledObject", "llama-8b-vllm")["spec"]["triggers"][0]
    threshold = float(trig["metadata"]["threshold"])
    assert trig["metricType"] == "AverageValue"
    assert keda_average_value(value, threshold) == LIVE_DESIRED
    # What `metricType: Value` would do with the same gauge: multiply by the current count.
    assert keda_value(value, threshold, current) == LIVE_DESIRED * current


def test_frozen_sizers_give_an_empty_result_so_the_fallback_engages(prometheus) -> None:
    frozen = trigger_query().replace(
        'deployment="llama-8b-vllm"', f'deployment="{FROZEN_DEPLOYMENT}"'
    )
    assert frozen != trigger_query()
    # Empty + ignoreNullValues "false" = a scaler error, counted towards fallback.failureThreshold.
    assert instant(prometheus, frozen) == []
    # The bare gauge is still there: without the guard KEDA would keep scaling on a stale value.
    bare = f'max(vllm_sizer_desired_replicas{{deployment="{FROZEN_DEPLOYMENT}"}})'
    assert len(instant(prometheus, bare)) == 1


def for_deployment(query: str, deployment: str) -> str:
    """The shipped query for another deployment (its name also prefixes its pods)."""
    return query.replace("llama-8b-vllm", deployment)


def adapter_query(deployment: str) -> str:
    config = yaml.safe_load(find("ConfigMap", "prometheus-adapter")["data"]["config.yaml"])
    (rule,) = config["externalRules"]
    return for_deployment(
        rule["metricsQuery"]
        .replace("<<.Series>>", "vllm_sizer_desired_replicas")
        .replace("<<.LabelMatchers>>", 'namespace="inference",deployment="llama-8b-vllm"'),
        deployment,
    )


def test_low_confidence_serves_the_sizers_own_hand_over_count(prometheus) -> None:
    # What an in-flight rule would have made of the pods: ceil(200 / 64), not the sizer's count.
    assert math.ceil(sum(r + w for r, w in UNSURE_PODS) / 64) != UNSURE_DESIRED
    for query in (
        for_deployment(trigger_query(), UNSURE_DEPLOYMENT),
        adapter_query(UNSURE_DEPLOYMENT),
    ):
        (sample,) = instant(prometheus, query)
        assert float(sample["value"][1]) == UNSURE_DESIRED, query
    # The adapter's series carries the deployment the HPA selects on.
    assert instant(prometheus, adapter_query(UNSURE_DEPLOYMENT))[0]["metric"] == {
        "deployment": UNSURE_DEPLOYMENT
    }


def test_shipped_queries_read_only_the_sizers_series() -> None:
    for query in (trigger_query(), adapter_query("llama-8b-vllm")):
        assert "vllm:" not in query and "calibration_confidence" not in query, query


def test_high_confidence_keeps_the_sizers_count_and_frozen_stays_empty(prometheus) -> None:
    # KEDA's trigger and the adapter's rule agree in every case.
    (keda,) = instant(prometheus, trigger_query())
    (adapter,) = instant(prometheus, adapter_query("llama-8b-vllm"))
    assert float(keda["value"][1]) == float(adapter["value"][1]) == LIVE_DESIRED
    # Frozen sizers, even one reporting a low confidence, leave the result empty: the fallback.
    assert instant(prometheus, for_deployment(trigger_query(), FROZEN_DEPLOYMENT)) == []
    assert instant(prometheus, adapter_query(FROZEN_DEPLOYMENT)) == []


def test_sum_would_multiply_the_sidecar_copies(prometheus) -> None:
    summed = instant(prometheus, 'sum(vllm_sizer_desired_replicas{deployment="llama-8b-vllm"})')
    assert float(summed[0]["value"][1]) == LIVE_DESIRED * LIVE_COPIES + FROZEN_DESIRED


def test_adapter_rule_gives_the_hpa_one_series_worth_the_recommendation(prometheus) -> None:
    config = yaml.safe_load(find("ConfigMap", "prometheus-adapter")["data"]["config.yaml"])
    (rule,) = config["externalRules"]
    query = (
        rule["metricsQuery"]
        .replace("<<.Series>>", "vllm_sizer_desired_replicas")
        .replace("<<.LabelMatchers>>", 'namespace="inference",deployment="llama-8b-vllm"')
    )
    result = instant(prometheus, query)
    assert [r["metric"] for r in result] == [{"deployment": "llama-8b-vllm"}]
    # The HPA sums the external metric's series, then applies AverageValue "1".
    target = float(
        find("HorizontalPodAutoscaler")["spec"]["metrics"][0]["external"]["target"]["averageValue"]
    )
    total = sum(float(r["value"][1]) for r in result)
    for current in range(1, 9):
        assert keda_average_value(total, target) == LIVE_DESIRED, current


@pytest.mark.parametrize(
    "query", panel_queries(), ids=lambda q: f"{q.panel_id}{q.ref_id}-{q.panel_title}"
)
def test_every_dashboard_query_returns_a_series(prometheus, query) -> None:
    assert instant(prometheus, query.expr), f"no series for {query.expr}"


def test_the_stub_serves_every_exported_series() -> None:
    registry = CollectorRegistry()
    registry.register(StubCollector(SizerValues()))
    assert {s.name for f in registry.collect() for s in f.samples} == EXPORTED_METRICS


@pytest.mark.parametrize("spec", ENUM_GAUGES, ids=lambda spec: spec.name)
def test_enum_panels_show_only_the_current_value(prometheus, spec) -> None:
    # The enum's own panel (`== 1`); others may read one of its values (the hand-over's).
    (query,) = [q for q in panel_queries() if PREFIX + spec.name in q.expr and "== 1" in q.expr]
    result = instant(prometheus, query.expr)
    assert [r["metric"] for r in result] == [{spec.label: SizerValues().enums[spec.name]}]
