"""The scale_from_zero demand query under faults: over real loopback HTTP, each bad answer is
cut off or refused with its reason, counted under source "demand", logged once per run of
failures, and never turns into a 0 or a move away from 0."""

from __future__ import annotations

import json
import logging
import time

import pytest
from prometheus_client import CollectorRegistry

from exporter.base.clock import ManualClock
from exporter.base.errors import FailureReason, PrometheusQueryError
from exporter.collector.demand import DemandSource
from exporter.collector.promapi import PrometheusClient
from exporter.collector.sources import SourceRead
from exporter.config.values import (
    Config,
    DemandKind,
    DeploymentConfig,
    PrometheusConfig,
    ScaleFromZeroConfig,
    SloConfig,
    SourceConfig,
)
from exporter.daemon.daemon import Daemon
from exporter.sizing.reasons import Reason
from model import ServerConfig, ServiceParams
from tests.reliability.fault_server import Fault, FaultServer

LLAMA = ServiceParams(6.68, 2.01e-2, 5.52e-5)
QUERY = "sum(rate(router_requests_total[1m]))"


def vector(*values: str) -> str:
    result = [{"metric": {"pod": f"p{i}"}, "value": [1.0, v]} for i, v in enumerate(values)]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}})


SCALAR = json.dumps({"status": "success", "data": {"resultType": "scalar", "result": [1.0, "2.5"]}})
REJECTED = json.dumps({"status": "error", "errorType": "bad_data", "error": "parse error"})
BAD_ANSWERS = [
    (vector(), FailureReason.BAD_VALUE, "no series"),
    (vector("1", "2"), FailureReason.BAD_VALUE, "2 series"),
    (vector("NaN"), FailureReason.BAD_VALUE, "value nan"),
    (vector("+Inf"), FailureReason.BAD_VALUE, "value inf"),
    (vector("-1"), FailureReason.BAD_VALUE, "value -1.0"),
    ("<html>proxy error</html>", FailureReason.BAD_RESPONSE, "malformed response"),
    (REJECTED, FailureReason.QUERY, "bad_data: parse error"),
]


@pytest.mark.parametrize(("body", "reason", "text"), BAD_ANSWERS, ids=lambda v: str(v)[:20])
def test_a_bad_answer_is_an_error_with_its_reason_never_a_value(
    body: str, reason: FailureReason, text: str
) -> None:
    with FaultServer(Fault.SERVE, [body]) as server:
        source = demand_source(server)
        with pytest.raises(PrometheusQueryError) as info:
            source.read()
    assert info.value.reason is reason and text in str(info.value)
    assert info.value.query == QUERY


def test_one_value_or_a_scalar_is_the_demand() -> None:
    with FaultServer(Fault.SERVE, [vector("3.5"), SCALAR]) as server:
        source = demand_source(server)
        assert source.read().value == 3.5
        assert source.read().value == 2.5


@pytest.mark.parametrize("fault", [Fault.HANG, Fault.DRIP, Fault.HUGE])
def test_a_slow_or_endless_answer_is_cut_off_by_the_client_deadline(fault: Fault) -> None:
    with FaultServer(fault) as server:
        client = PrometheusClient(server.url.removesuffix("/metrics"), timeout_s=1.0)
        start = time.monotonic()
        with pytest.raises(PrometheusQueryError) as info:
            DemandSource(client=client, query=QUERY).read()
    assert info.value.reason in (FailureReason.TIMEOUT, FailureReason.BODY_TOO_LARGE)
    assert time.monotonic() - start < 2.5


def demand_source(server: FaultServer) -> DemandSource:
    return DemandSource(client=PrometheusClient(server.url.removesuffix("/metrics")), query=QUERY)


class NoPods:
    """A Prometheus source that finds no vLLM pod: the deployment is at zero."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock

    def read(self) -> SourceRead:
        return SourceRead(time_s=self.clock.time(), samples=())


def test_the_daemon_counts_logs_once_and_holds_zero_while_the_query_fails(
    caplog: pytest.LogCaptureFixture,
) -> None:
    answers = {"body": vector("0")}
    with FaultServer(Fault.SERVE, lambda: answers["body"]) as server:
        base = server.url.removesuffix("/metrics")
        dep = DeploymentConfig(
            name="llama", model_name="m", server=ServerConfig(), slo=SloConfig(ttft_ms=60.0),
            source=SourceConfig(prometheus_selector='{namespace="x"}'), initial_params=LLAMA,
            min_replicas=0, max_replicas=4,
            scale_from_zero=ScaleFromZeroConfig(demand_query=QUERY, idle_s=10.0),
        )  # fmt: skip
        config = Config(
            cycle_period_s=5.0, prometheus=PrometheusConfig(base, timeout_s=1.0), deployments=(dep,)
        )
        clock, registry = ManualClock(1_000.0), CollectorRegistry()
        demand = DemandSource(client=PrometheusClient(base, timeout_s=1.0), query=QUERY)
        daemon = Daemon(config, {"llama": NoPods(clock)}, registry, clock, demand={"llama": demand})

        def cycle() -> tuple[float | None, str]:
            clock.advance(5.0)
            snapshot = daemon.run_cycle()
            (status,) = snapshot.deployments
            return status.decision.desired_replicas, status.decision.reason.value

        def errors(reason: FailureReason) -> float | None:
            labels = {"deployment": "llama", "source": "demand", "reason": reason.value}
            return registry.get_sample_value("vllm_sizer_scrape_errors_total", labels)

        try:
            # A first start without pods: a full idle_s of 0 demand before 0.
            idle, to_zero = (None, Reason.IDLE), (0, Reason.SCALED_TO_ZERO)
            assert [cycle() for _ in range(3)] == [idle, idle, to_zero]
            # No pod, but the demand was read: the cycles succeeded (readiness, KEDA's freshness
            # guard and the alerts see a working sizer at zero).
            assert registry.get_sample_value("vllm_sizer_cycles_total", {"outcome": "ok"}) == 3
            assert daemon.ready()
            assert registry.get_sample_value(
                "vllm_sizer_demand", {"deployment": "llama", "model_name": "m", "kind": "rate"}
            ) == 0.0
            assert {errors(r) for r in FailureReason} == {0.0}  # every reason exists from start
            caplog.set_level(logging.DEBUG, logger="exporter.collector.demand")
            for body, reason, _ in BAD_ANSWERS:
                answers["body"] = body
                assert cycle() == (0, Reason.DEMAND_UNKNOWN), body
                assert errors(reason) is not None and errors(reason) >= 1, body
            server.fault = Fault.HANG
            assert cycle() == (0, Reason.DEMAND_UNKNOWN)
            assert errors(FailureReason.TIMEOUT) == 1.0
            # Nothing observed since the demand failed: those cycles failed.
            failed = registry.get_sample_value("vllm_sizer_cycles_total", {"outcome": "failed"})
            assert failed == len(BAD_ANSWERS) + 1
            assert registry.get_sample_value(
                "vllm_sizer_demand", {"deployment": "llama", "model_name": "m", "kind": "rate"}
            ) is None  # unknown: omitted, never 0
            warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
            assert len(warnings) == 1 and "demand query failed" in warnings[0].getMessage()
            server.fault = Fault.SERVE
            answers["body"] = vector("4")
            desired, reason = cycle()
            assert reason == Reason.DEMAND_FROM_ZERO and desired is not None and desired >= 1
            assert any("answers again" in r.getMessage() for r in caplog.records)
            # vLLM's own reads never failed: all of it was counted under "demand".
            for reason in FailureReason:
                labels = {"deployment": "llama", "source": "prometheus", "reason": reason.value}
                assert registry.get_sample_value("vllm_sizer_scrape_errors_total", labels) == 0.0
        finally:
            daemon.close()


def test_a_daemon_without_the_demand_source_of_a_zero_deployment_is_refused() -> None:
    dep = DeploymentConfig(
        name="llama", model_name="m", server=ServerConfig(), slo=SloConfig(ttft_ms=60.0),
        source=SourceConfig(prometheus_selector='{namespace="x"}'), min_replicas=0,
        scale_from_zero=ScaleFromZeroConfig(
            demand_query=QUERY, idle_s=60.0, demand=DemandKind.QUEUE
        ),
    )  # fmt: skip
    clock = ManualClock()
    with pytest.raises(ValueError, match=r"`demand` must have a source .*got none for llama"):
        Daemon(Config(deployments=(dep,)), {"llama": NoPods(clock)}, CollectorRegistry(), clock)
