"""A KV cache too small for the load: the collector sees the saturation on a real vLLM."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from bench.real_vllm.server import RunningServer, ServerOptions, vllm_server
from exporter.base.clock import SystemClock
from exporter.collector.observations import observe_deployment
from exporter.collector.saturation import Saturation
from exporter.collector.sources import ScrapeSource, SourceRead
from exporter.testbed.load_run import LoadResult, LoadSpec
from exporter.testbed.loadgen import run_load
from tests.vllm.conftest import require_prepared

pytestmark = pytest.mark.vllm

# 48 blocks of 128 tokens hold about 8 requests of 768 tokens; 32 batch slots want 4 times that.
KV_BLOCKS = 48
INPUT_TOKENS = 512
OUTPUT_TOKENS = 256


async def overload(server: RunningServer, source: ScrapeSource) -> tuple[LoadResult, SourceRead,
                                                                          SourceRead]:
    spec = LoadSpec(base_url=server.base_url, model=server.model, rate_rps=6.0,
                    input_tokens=INPUT_TOKENS, output_tokens=OUTPUT_TOKENS, duration_s=15.0,
                    timeout_s=120.0, drain_s=120.0)
    start = await asyncio.to_thread(source.read)
    task = asyncio.create_task(run_load(spec, np.random.default_rng(5)))
    await asyncio.sleep(14.0)
    end = await asyncio.to_thread(source.read)
    return await task, start, end


def test_a_full_kv_cache_is_seen_as_saturation() -> None:
    require_prepared()
    options = ServerOptions(num_gpu_blocks_override=KV_BLOCKS)
    with vllm_server(options, log_name="kv-pressure") as server:
        source = ScrapeSource(clock=SystemClock(), urls=[server.metrics_url],
                              model_name=server.model)
        result, start, end = asyncio.run(overload(server, source))
    # vLLM queues and preempts rather than failing: every request still completes.
    assert result.failed == 0
    window = observe_deployment(start, end, deployment="tiny")
    assert window.success, window.message
    assert Saturation.WAITING in window.saturation
    assert {Saturation.KV_FULL, Saturation.PREEMPTIONS} & set(window.saturation)
    assert window.avg_running_per_pod is not None and window.avg_running_per_pod < 32
    assert window.max_kv_cache_usage_ratio is not None and window.max_kv_cache_usage_ratio > 0.5
