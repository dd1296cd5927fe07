"""KEDA's and the HPA's view of the real daemon, through a real Prometheus server.

`vllm-sizer run` (a subprocess) sizes two emulated vLLM replicas under a load that needs more
than two; Prometheus (Debian's server, on loopback) scrapes the daemon with the `namespace`
target label a PodMonitor would add. The exact ScaledObject trigger PromQL, evaluated through
Prometheus' HTTP API, must return the daemon's own desired_replicas as a single element; KEDA's
AverageValue rule on it gives that count whatever the current replica count, where Value would
multiply by the current count. The adapter rule does the same for the HPA, and every dashboard
query returns a series.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

import exporter.testbed.emulator as emulator
import tests.integration.prometheus_server as prometheus_server
from model import ServerConfig, ServiceParams
from model.simulation.workloads import LengthDist, LengthKind
from tests.conftest import REPO_ROOT
from tests.ecosystem.dashboard import panel_queries
from tests.ecosystem.manifests import find

pytestmark = pytest.mark.integration

DEPLOYMENT = "llama-8b-vllm"  # the name in the shipped ScaledObject query: used verbatim
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA = ServiceParams(6.68, 2.01e-2, 5.52e-5)  # paper Table I, ms
RATE_RPS = 25.0  # 2.5x the SLO capacity of one replica: the true need is 3 replicas
REPLICAS = 2
CYCLE_S = 1  # the shortest the config allows: keeps the test short; settled() rides out changes
DESIRED = "vllm_sizer_desired_replicas"


def daemon_config(urls: list[str], port: int, state: Path) -> dict[str, Any]:
    return {
        "cycle_period_s": CYCLE_S,
        "listen_address": f"127.0.0.1:{port}",
        "state_file": str(state),
        "deployments": [
            {
                "name": DEPLOYMENT,
                "model_name": MODEL,
                "source": {"scrape_urls": urls},
                # Percentile targets loose enough never to bind, so that their series exist.
                "slo": {
                    "ttft_ms": 40,
                    "itl_ms": 25,
                    "ttft": {"p95_ms": 5000},
                    "itl": {"p99_ms": 500},
                },
                "replicas": {"min": 1, "max": 8},
                "scale_down_stabilization_s": 0,
                "initial_params": LLAMA.to_dict(),
                "tuner": {"min_observations": 3, "window": 5},
            }
        ],
    }


def daemon_samples(port: int) -> list[Any]:
    """Every sample of the deployment on the daemon's /metrics ([] while it is not up)."""
    try:
        text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except requests.RequestException:
        return []
    return [
        s
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels.get("deployment") == DEPLOYMENT
    ]


def daemon_values(port: int) -> dict[str, float]:
    """{sample name: value} of the deployment's plain (deployment, model_name) series."""
    return {
        s.name: s.value
        for s in daemon_samples(port)
        if set(s.labels) == {"deployment", "model_name"}
    }


def instant(url: str, query: str) -> list[dict[str, Any]]:
    response = requests.post(f"{url}/api/v1/query", data={"query": query}, timeout=5)
    body = response.json()
    assert response.status_code == 200 and body["status"] == "success", body
    return list(body["data"]["result"])


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, str]]:
    """(daemon port, Prometheus URL) with the fleet, the daemon and Prometheus running."""
    work = tmp_path_factory.mktemp("keda-on-daemon")
    fleet = emulator.EmulatedFleet(
        LLAMA,
        ServerConfig(),
        rng=np.random.default_rng(7),
        arrivals=RATE_RPS,
        input_lengths=LengthDist(LengthKind.UNIFORM, 1024),
        output_lengths=LengthDist(LengthKind.UNIFORM, 128),
        model_name=MODEL,
        replicas=REPLICAS,
    )
    port = prometheus_server.free_port()
    config, log = work / "config.yaml", work / "daemon.log"
    with fleet:
        config.write_text(yaml.safe_dump(daemon_config(fleet.urls, port, work / "state.json")))
        with log.open("wb") as out:
            daemon = subprocess.Popen(
                [sys.executable, "-m", "exporter.cli.main", "run", "--config", str(config)],
                cwd=REPO_ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(os.environ, PYTHONUNBUFFERED="1"),
            )
        target = prometheus_server.Target(
            f"http://127.0.0.1:{port}/metrics", labels={"namespace": "inference"}
        )
        (work / "prometheus").mkdir()
        prom = prometheus_server.PrometheusServer(
            [target], workdir=work / "prometheus", scrape_interval_s=0.5
        )
        try:
            prom.start()
            # Every series the dashboard reads, the late ones (fit, saturation, headroom) included.
            deadline = time.monotonic() + 90
            while True:
                names = {sample.name for sample in daemon_samples(port)}
                values = daemon_values(port)
                wanted = {
                    "vllm_sizer_fit_error_ratio",
                    "vllm_sizer_observed_itl_seconds",
                    "vllm_sizer_saturated",
                    "vllm_sizer_slo_headroom_ratio",
                }
                if DESIRED in values and wanted <= names:
                    break
                if daemon.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"daemon not sizing: {values}\n{log.read_text()[-3000:]}")
                time.sleep(0.5)
            prom.wait_for_scrape(after_s=time.time())
            prom.wait_for_scrape(after_s=time.time())  # two fresh samples for rate()
            yield port, prom.base_url
        finally:
            prom.stop()
            daemon.terminate()
            try:
                daemon.wait(timeout=10)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait(timeout=10)


def settled(stack: tuple[int, str], query: str) -> tuple[float, list[dict[str, Any]]]:
    """(daemon's desired, Prometheus' result for `query`) once both agree on a scrape."""
    port, url = stack
    result: list[dict[str, Any]] = []
    for _ in range(20):
        before = daemon_values(port).get(DESIRED)
        result = instant(url, query)
        after = daemon_values(port).get(DESIRED)
        if before == after and result and float(result[0]["value"][1]) == after:
            return after, result
        time.sleep(0.5)  # the daemon changed its mind between scrape and query: look again
    return daemon_values(port).get(DESIRED, math.nan), result


def test_trigger_query_returns_the_daemons_desired_count(stack) -> None:
    trig = find("ScaledObject", "llama-8b-vllm")["spec"]["triggers"][0]
    desired, result = settled(stack, trig["metadata"]["query"])
    assert len(result) == 1, result  # KEDA needs a single element
    value = float(result[0]["value"][1])
    assert value == desired
    threshold = float(trig["metadata"]["threshold"])
    assert trig["metricType"] == "AverageValue"
    for current in range(1, 9):
        # AverageValue: ceil(value / threshold) whatever the current count...
        assert math.ceil(value / threshold) == desired
        # ...where Value would compute ceil(value / threshold x current).
        assert math.ceil(value / threshold * current) == desired * current
    current = daemon_values(stack[0])["vllm_sizer_current_replicas"]
    assert current == REPLICAS
    assert math.ceil(value / threshold * current) > desired  # Value overshoots right now


def test_adapter_rule_gives_the_hpa_the_daemons_desired_count(stack) -> None:
    config = yaml.safe_load(find("ConfigMap", "prometheus-adapter")["data"]["config.yaml"])
    (rule,) = config["externalRules"]
    query = (
        rule["metricsQuery"]
        .replace("<<.Series>>", DESIRED)
        .replace("<<.LabelMatchers>>", f'namespace="inference",deployment="{DEPLOYMENT}"')
    )
    desired, result = settled(stack, query)
    assert [r["metric"] for r in result] == [{"deployment": DEPLOYMENT}]
    target = find("HorizontalPodAutoscaler")["spec"]["metrics"][0]["external"]["target"]
    total = sum(float(r["value"][1]) for r in result)  # the HPA sums an external metric's series
    assert math.ceil(total / float(target["averageValue"])) == desired


# Exported only for deployments with scale_from_zero, which this scrape-mode daemon cannot have:
# tests/integration/test_scale_to_zero.py runs that panel's query on a daemon that has one.
SCALE_TO_ZERO_ONLY = "vllm_sizer_demand"
# Exported only with a `models` section: tests/integration/test_fleet_live.py runs those panels'
# queries on a daemon sizing two variants.
FLEET_ONLY = ("vllm_sizer_fleet_", "vllm_sizer_variant_", "vllm_sizer_inventory_")
FLEET_PANEL_QUERIES = 10


def test_every_dashboard_query_returns_a_series_from_the_daemon(stack) -> None:
    _, url = stack
    queries = [q.expr for q in panel_queries() if SCALE_TO_ZERO_ONLY not in q.expr
               and not any(name in q.expr for name in FLEET_ONLY)]  # fmt: skip
    assert len(queries) == len(panel_queries()) - 1 - FLEET_PANEL_QUERIES
    empty = [expr for expr in queries if not instant(url, expr)]
    # The arrival CV and the prompt burst factor exist in sidecar mode only (one loopback URL,
    # the per-second sampler); this stack reads two pods.
    # tests/exporter/collector/test_arrival_sampler.py checks the daemon exports the CV there,
    # tests/exporter/sizing/test_bursts.py the burst reading.
    # The forecast error needs forecast_choice.MIN_SCORED scored cycles, more than this stack
    # runs; tests/exporter/daemon/test_exposition.py checks it is exported once there is one.
    assert empty == [
        'max(vllm_sizer_arrival_cv{deployment="llama-8b-vllm"})',
        'vllm_sizer_prompt_burst_factor{deployment="llama-8b-vllm"}',
        'vllm_sizer_forecast_error_ratio{deployment="llama-8b-vllm"}',
    ]
