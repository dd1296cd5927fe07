"""/api/v1/predict with percentiles, over real HTTP on loopback: the configured targets'
percentiles and the binding target in every answer, the asked percentiles on request."""

from __future__ import annotations

import json
from dataclasses import replace
from urllib.request import urlopen

import pytest
from prometheus_client import CollectorRegistry

from exporter.config.values import SloConfig
from exporter.daemon.daemon import Daemon
from exporter.daemon.server import SizerHTTPServer
from exporter.sizing.traffic import ModelInputs
from model import LatencyMetric, PercentileTarget, latency_quantiles
from tests.exporter.daemon.test_daemon import (
    SERVER,
    FleetSource,
    _error,
    config,
    cycles,
    fleet,  # noqa: F401  (fixture)
)

TTFT_P95 = PercentileTarget(LatencyMetric.TTFT, 0.95, 300.0)
ITL_P99 = PercentileTarget(LatencyMetric.ITL_PER_REQUEST, 0.99, 0.5)  # missed at any load


def test_predict_returns_target_and_asked_percentiles(fleet) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    emulated, clock = fleet
    base = config()
    dep = replace(base.deployments[0], slo=SloConfig(percentiles=(TTFT_P95, ITL_P99)))
    daemon = Daemon(
        replace(base, deployments=(dep,)), {"llama": FleetSource(emulated)},
        CollectorRegistry(), emulated.sim_clock,
    )  # fmt: skip
    http = SizerHTTPServer("127.0.0.1", 0, CollectorRegistry(), daemon.ready, daemon.predict)
    http.start()
    url = f"http://127.0.0.1:{http.port}/api/v1/predict?deployment=llama&rate=12&replicas=3"
    try:
        cycles(daemon, emulated, clock, 2)
        with urlopen(url + "&percentiles=99.9,50,95") as resp:
            body = json.loads(resp.read())
        runtime = daemon.runtimes["llama"].cycle
        assert runtime.params is not None and runtime.workload is not None
        # The daemon's model inputs: the configured ones with the measured traffic shape.
        inputs = runtime.inputs or ModelInputs(dep.model, SERVER)
        expected = latency_quantiles(
            runtime.params, inputs.server, runtime.workload, 4.0, [0.5, 0.95, 0.999],
            options=inputs.options,
        )  # fmt: skip
        assert list(body["percentiles"]) == ["50", "95", "99.9"]
        p95 = body["percentiles"]["95"]
        assert p95["ttft_seconds"] == pytest.approx(float(expected.ttft_ms[1]) / 1000)
        assert p95["itl_per_token_seconds"] == pytest.approx(
            float(expected.itl_per_token_ms[1]) / 1000
        )
        ttft, itl = body["percentile_targets"]
        assert (ttft["target"], ttft["percentile"]) == ("ttft_p95", "95")
        assert ttft["target_seconds"] == pytest.approx(0.3)
        assert ttft["predicted_seconds"] == pytest.approx(p95["ttft_seconds"])
        assert ttft["met"] is True and ttft["predicted_attainment"] >= 0.95
        assert (itl["target"], itl["met"]) == ("itl_per_request_p99", False)
        assert body["binding_target"] == "itl_per_request_percentile"
        assert body["slo_feasible"] is False and body["replicas_needed"] is None
        with urlopen(url) as resp:
            assert json.loads(resp.read())["percentiles"] == {}
        for bad in ("100", "0.5", "95,abc", "95.55", ",".join(["90"] * 9)):
            status, error = _error(url + "&percentiles=" + bad)
            assert (status, error["parameter"]) == (400, "percentiles"), bad
    finally:
        http.stop()
