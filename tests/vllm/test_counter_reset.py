"""vLLM restarted inside a window: the collector sees the reset and counts from zero."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from bench.real_vllm.server import ServerOptions, free_port, vllm_server
from exporter.base.clock import SystemClock
from exporter.base.errors import FailureReason
from exporter.collector.observations import observe_deployment
from exporter.collector.pod_observation import Problem
from exporter.collector.sources import ScrapeSource, SourceRead
from exporter.collector.vllm_metrics import CounterName
from exporter.testbed.load_run import LoadResult, LoadSpec, RequestStatus
from exporter.testbed.loadgen import run_load
from tests.vllm.conftest import require_prepared

pytestmark = pytest.mark.vllm

INPUT_TOKENS = 96
OUTPUT_TOKENS = 24


def spec(port: int, duration_s: float) -> LoadSpec:
    return LoadSpec(base_url=f"http://127.0.0.1:{port}", model="tiny", rate_rps=3.0,
                    input_tokens=INPUT_TOKENS, output_tokens=OUTPUT_TOKENS,
                    duration_s=duration_s, timeout_s=30.0, drain_s=30.0)


async def first_life(port: int, source: ScrapeSource) -> tuple[SourceRead, LoadResult]:
    """Load a server, read it mid-run, then kill it while the load is still arriving."""
    with vllm_server(ServerOptions(port=port), log_name="reset-a"):
        task = asyncio.create_task(run_load(spec(port, 14.0), np.random.default_rng(1)))
        await asyncio.sleep(6.0)
        window_start = await asyncio.to_thread(source.read)
        await asyncio.sleep(3.0)
    return window_start, await task


def test_restart_mid_window_is_a_counter_reset() -> None:
    require_prepared()
    port = free_port()
    source = ScrapeSource(clock=SystemClock(), urls=[f"http://127.0.0.1:{port}/metrics"],
                          model_name="tiny")
    window_start, killed_run = asyncio.run(first_life(port, source))
    # Requests that met the dead server are recorded as failures; the run itself survives.
    assert killed_run.completed and killed_run.failed > 0
    assert {r.status for r in killed_run.records if not r.ok} <= {
        RequestStatus.CONNECT_ERROR, RequestStatus.PROTOCOL_ERROR}

    down = source.read()
    assert down.samples == () and [f.reason for f in down.failures] == [FailureReason.CONNECTION]

    with vllm_server(ServerOptions(port=port), log_name="reset-b"):
        second_run = asyncio.run(run_load(spec(port, 8.0), np.random.default_rng(2)))
        window_end = source.read()
    assert second_run.failed == 0

    window = observe_deployment(window_start, window_end, deployment="tiny")
    assert window.success, window.message
    assert Problem.COUNTER_RESET in window.problems
    (pod,) = window.pods
    assert pod.reset
    # Counted from zero, as Prometheus rate() does: exactly the restarted server's requests.
    assert pod.completed == len(second_run.completed)
    assert window.avg_input_tokens == pytest.approx(INPUT_TOKENS)
    assert window.avg_output_tokens == pytest.approx(OUTPUT_TOKENS)
    before = window_start.samples[0]
    after = window_end.samples[0]
    assert after.process_start_s is not None and before.process_start_s is not None
    assert after.process_start_s > before.process_start_s
    # A naive difference would have undercounted (or gone negative).
    success = CounterName.REQUEST_SUCCESS
    assert after.counters[success] - before.counters[success] < pod.completed
