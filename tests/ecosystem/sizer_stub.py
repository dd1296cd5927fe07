"""A stand-in for the daemon's /metrics: every issue-6 series, values set by the test.

Used to run the shipped PromQL (KEDA trigger, adapter rule, dashboard) against a real Prometheus
server without depending on the daemon's tuning: several stubs play the sidecar copies of one
deployment, one of them frozen (its last successful cycle long ago).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

PREFIX = "vllm_sizer_"


@dataclass(kw_only=True)
class SizerValues:
    """What one stub exports; mutable so a test can change it between scrapes."""

    deployment: str = "llama-8b-vllm"
    model_name: str = "meta-llama/Llama-3.1-8B-Instruct"
    desired_replicas: int = 5
    current_replicas: int = 3
    last_success_age_s: float = 1.0
    per_deployment: dict[str, float] = field(
        default_factory=lambda: {
            "predicted_ttft_seconds": 0.21,
            "predicted_itl_seconds": 0.031,
            "observed_ttft_seconds": 0.24,
            "observed_itl_seconds": 0.029,
            "arrival_rate_requests_per_second": 11.0,
            "max_rate_per_replica_requests_per_second": 2.4,
            "saturation_rate_per_replica_requests_per_second": 3.9,
            "model_alpha_seconds": 0.006,
            "model_beta_seconds": 0.00003,
            "model_gamma_seconds": 0.0000002,
            "slo_ttft_seconds": 0.5,
            "slo_itl_seconds": 0.05,
        }
    )


class StubCollector:
    """Builds the families from the current `SizerValues` on every scrape."""

    def __init__(self, values: SizerValues) -> None:
        self.values = values

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        v = self.values
        labels = ["deployment", "model_name"]
        key = [v.deployment, v.model_name]

        def gauge(name: str, value: float, extra: dict[str, str] | None = None) -> Metric:
            extra = extra or {}
            family = GaugeMetricFamily(
                PREFIX + name, f"{name} as of the last cycle", labels=[*labels, *extra]
            )
            family.add_metric([*key, *extra.values()], value)
            return family

        yield gauge("desired_replicas", v.desired_replicas)
        yield gauge("current_replicas", v.current_replicas)
        for name, value in v.per_deployment.items():
            yield gauge(name, value)
        fit = GaugeMetricFamily(
            PREFIX + "fit_relative_error", "fit error", labels=[*labels, "metric"]
        )
        fit.add_metric([*key, "ttft"], 0.04)
        fit.add_metric([*key, "itl"], 0.02)
        yield fit
        yield gauge("recommendation_info", 1, {"reason": "slo"})
        yield gauge("tuner_state_info", 1, {"state": "tracking"})
        errors = CounterMetricFamily(
            PREFIX + "scrape_errors", "errors", labels=["deployment", "source", "reason"]
        )
        errors.add_metric([v.deployment, "scrape", "connection"], 0)
        yield errors
        duration = GaugeMetricFamily(PREFIX + "cycle_duration_seconds", "last cycle")
        duration.add_metric([], 0.012)
        yield duration
        last = GaugeMetricFamily(PREFIX + "last_successful_cycle_timestamp_seconds", "last ok")
        last.add_metric([], time.time() - v.last_success_age_s)
        yield last
        build = GaugeMetricFamily(PREFIX + "build_info", "build", labels=["version"])
        build.add_metric(["0.1.0"], 1)
        yield build


class StubSizer:
    """One stub /metrics endpoint on 127.0.0.1 (an ephemeral port)."""

    def __init__(self, values: SizerValues | None = None) -> None:
        self.values = values or SizerValues()
        registry = CollectorRegistry()
        registry.register(StubCollector(self.values))
        self._server, self._thread = start_http_server(0, addr="127.0.0.1", registry=registry)
        self.address = f"127.0.0.1:{self._server.server_port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
