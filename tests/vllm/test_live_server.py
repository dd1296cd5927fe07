"""A live vLLM: the collector's metrics exist, and a window agrees with the load generator."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from bench.real_vllm.server import RunningServer
from exporter.base.clock import SystemClock
from exporter.collector.observations import observe_deployment
from exporter.collector.sources import ScrapeSource, SourceRead
from exporter.collector.vllm_metrics import (
    CounterName,
    GaugeName,
    HistogramName,
    SampleStatus,
    parse_exposition,
)
from exporter.testbed.load_run import LoadResult, LoadSpec
from exporter.testbed.loadgen import run_load

pytestmark = pytest.mark.vllm

# collector-spec §4: every series the collector reads or may read, as exposed (sample names).
SPEC_SAMPLES = (
    "vllm:request_success_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:num_preemptions_total",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:cache_config_info",
    *(
        f"vllm:{base}_{suffix}"
        for base in (
            "time_to_first_token_seconds",
            "request_time_per_output_token_seconds",
            "inter_token_latency_seconds",
            "request_prompt_tokens",
            "request_generation_tokens",
            "request_queue_time_seconds",
            "request_inference_time_seconds",
        )
        for suffix in ("sum", "count")
    ),
)
EXPECTED_TYPES = {
    "vllm:request_success": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
}
INPUT_TOKENS = 128
OUTPUT_TOKENS = 32
RATE_RPS = 4.0
LOAD_S = 30.0
WINDOW_START_S = 8.0
WINDOW_LENGTH_S = 18.0
AGREEMENT = 0.05


def scrape_text(server: RunningServer) -> str:
    response = requests.get(server.metrics_url, timeout=10.0)
    response.raise_for_status()
    return response.text


def test_every_spec_metric_is_exposed_with_its_type(vllm: RunningServer) -> None:
    families = list(text_string_to_metric_families(scrape_text(vllm)))
    samples = {s.name for family in families for s in family.samples}
    assert sorted(set(SPEC_SAMPLES) - samples) == []
    types = {family.name: family.type for family in families}
    assert {name: types.get(name) for name in EXPECTED_TYPES} == EXPECTED_TYPES
    models = {s.labels.get("model_name") for f in families for s in f.samples
              if s.name.startswith("vllm:") and "model_name" in s.labels}
    assert models == {vllm.model}


def test_collector_reads_every_signal_under_its_current_name(vllm: RunningServer) -> None:
    sample = parse_exposition(scrape_text(vllm), pod="p", time_s=0.0, model_name=vllm.model)
    assert sample.status is SampleStatus.OK
    assert sample.legacy_names == ()  # vLLM 0.32 exposes every signal under its newest name
    assert sample.rejected_samples == 0 and sample.skipped_lines == 0
    assert set(sample.counters) == set(CounterName)
    assert set(sample.histograms) == set(HistogramName)
    assert set(sample.gauges) == set(GaugeName)
    assert sample.process_start_s is not None  # what tells a restart from a quiet window


async def _load_with_reads(
    spec: LoadSpec, source: ScrapeSource
) -> tuple[LoadResult, SourceRead, SourceRead, SourceRead, SourceRead]:
    before = await asyncio.to_thread(source.read)
    task = asyncio.create_task(run_load(spec, np.random.default_rng(9)))
    await asyncio.sleep(WINDOW_START_S)
    first = await asyncio.to_thread(source.read)
    await asyncio.sleep(WINDOW_LENGTH_S)
    second = await asyncio.to_thread(source.read)
    result = await task
    after = await asyncio.to_thread(source.read)
    return result, before, first, second, after


def within(measured: float, expected: float, tolerance: float = AGREEMENT) -> bool:
    return abs(measured - expected) <= tolerance * expected


def test_steady_window_agrees_with_the_load_generator(vllm: RunningServer) -> None:
    source = ScrapeSource(clock=SystemClock(), urls=[vllm.metrics_url], model_name=vllm.model)
    spec = LoadSpec(base_url=vllm.base_url, model=vllm.model, rate_rps=RATE_RPS,
                    input_tokens=INPUT_TOKENS, output_tokens=OUTPUT_TOKENS, duration_s=LOAD_S)
    result, before, first, second, after = asyncio.run(_load_with_reads(spec, source))
    assert result.failed == 0

    # The steady window, in the load generator's time base (s since its start).
    start_s = first.time_s - result.start_unix_s
    end_s = second.time_s - result.start_unix_s
    done = result.completed_between(start_s, end_s)
    assert len(done) >= 40  # enough requests that one at each edge stays within 5%
    window = observe_deployment(first, second, deployment="tiny")
    assert window.success, window.message
    assert window.problems == ()
    completions = window.completion_rate_rps * window.window_s
    assert within(completions, len(done))
    sent = sum(1 for r in result.records if start_s <= r.send_s < end_s)
    assert within(window.arrival_rate_rps * window.window_s, sent, 0.10)
    assert window.avg_input_tokens == pytest.approx(INPUT_TOKENS)
    assert window.avg_output_tokens == pytest.approx(OUTPUT_TOKENS)
    a, b = first.samples[0].counters, second.samples[0].counters
    prompt = b[CounterName.PROMPT_TOKENS] - a[CounterName.PROMPT_TOKENS]
    generated = b[CounterName.GENERATION_TOKENS] - a[CounterName.GENERATION_TOKENS]
    assert within(prompt, sum(r.prompt_tokens for r in done))
    assert within(generated, sum(r.output_tokens for r in done))

    # Latencies mean what they say. The server's TTFT excludes the HTTP path the client sees.
    # With every request the same length, the token-weighted ITL and the mean of per-request
    # TPOTs describe the same decode steps (requests straddling the window edges aside). The
    # client's TPOT is only a loose check: on a busy core it reads several chunks at once.
    client_ttft = float(np.mean([r.ttft_ms for r in done if r.ttft_ms is not None]))
    client_tpot = float(np.mean([t for r in done if (t := r.tpot_ms) is not None]))
    assert window.ttft_ms is not None and 0 < window.ttft_ms <= 1.05 * client_ttft + 1.0
    assert window.request_tpot_ms is not None and window.itl_ms is not None
    assert within(window.itl_ms, window.request_tpot_ms, 0.10)
    assert within(window.request_tpot_ms, client_tpot, 1.0)
    assert window.avg_running_per_pod is not None and window.avg_running_per_pod > 0

    # The whole run, drained: every request and token is counted exactly once.
    total = observe_deployment(before, after, deployment="tiny")
    assert sum(pod.completed for pod in total.pods) == result.sent
    assert total.avg_input_tokens == pytest.approx(INPUT_TOKENS)
    c0, c1 = before.samples[0].counters, after.samples[0].counters
    prompt_total = c1[CounterName.PROMPT_TOKENS] - c0[CounterName.PROMPT_TOKENS]
    generated_total = c1[CounterName.GENERATION_TOKENS] - c0[CounterName.GENERATION_TOKENS]
    assert prompt_total == result.prompt_tokens_total
    assert generated_total == result.output_tokens_total
