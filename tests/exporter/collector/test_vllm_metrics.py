"""Exposition parser: real vLLM 0.32 dump, old-name fixtures, filters, garbage, property tests."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.base.errors import ScrapeError
from exporter.collector.vllm_metrics import (
    BUCKETED,
    CounterName,
    GaugeName,
    HistogramName,
    HistogramTotals,
    PodSample,
    RawSeries,
    SampleStatus,
    parse_exposition,
    sample_from_series,
    wanted_sample_names,
)
from tests.conftest import DATA_DIR
from tests.fixtures.vllm_exposition import PodTotals, render, steady_increment


def parse(text: str, model_name: str | None = None) -> PodSample:
    return parse_exposition(text, pod="pod-a", time_s=100.0, model_name=model_name)


def test_real_vllm_032_dump(vllm_metrics_text: str) -> None:
    sample = parse(vllm_metrics_text, model_name="tiny")
    assert sample.status is SampleStatus.OK
    assert sample.pod == "pod-a" and sample.time_s == 100.0
    assert sample.model_names == ("tiny",)
    assert sample.legacy_names == ()
    assert (sample.skipped_lines, sample.rejected_samples) == (0, 0)
    # request_success_total summed over its five finished_reason series (0+1+0+0+0).
    assert sample.counters == {
        CounterName.REQUEST_SUCCESS: 1.0,
        CounterName.PROMPT_TOKENS: 5.0,
        CounterName.GENERATION_TOKENS: 16.0,
        CounterName.PREEMPTIONS: 0.0,
        CounterName.PROMPT_TOKENS_CACHED: 0.0,
        CounterName.PREFIX_CACHE_HITS: 0.0,
        CounterName.PREFIX_CACHE_QUERIES: 5.0,
    }
    # KV capacity from cache_config_info (no model_name label): 8192 blocks of 128 tokens.
    assert sample.kv_capacity_tokens == 8192 * 128
    # Buckets as exposed: the one 5-token prompt sits in (2, 5]; +Inf equals _count.
    prompt = sample.buckets[HistogramName.PROMPT_LEN]
    assert prompt.bounds[:4] == (1.0, 2.0, 5.0, 10.0) and prompt.bounds[-1] == 2000.0
    assert prompt.cumulative[:3] == (0.0, 0.0, 1.0) and prompt.cumulative[-1] == 1.0
    assert sample.buckets[HistogramName.ITL_S].cumulative[-1] == 15.0
    assert set(sample.buckets) == set(BUCKETED) and sample.bad_buckets == ()
    assert sample.histograms[HistogramName.TTFT_S] == HistogramTotals(0.04984712600708008, 1.0)
    assert sample.histograms[HistogramName.ITL_S] == HistogramTotals(0.09042505899992648, 15.0)
    assert sample.histograms[HistogramName.PROMPT_LEN] == HistogramTotals(5.0, 1.0)
    assert sample.histograms[HistogramName.GENERATION_LEN] == HistogramTotals(16.0, 1.0)
    assert sample.histograms[HistogramName.REQUEST_TPOT_S].count == 1.0
    assert sample.histograms[HistogramName.QUEUE_TIME_S].count == 1.0
    assert sample.histograms[HistogramName.INFERENCE_TIME_S].sum == pytest.approx(0.102935988)
    assert sample.gauges == {
        GaugeName.RUNNING: 0.0,
        GaugeName.WAITING: 0.0,
        GaugeName.KV_USAGE: 0.0,
    }
    assert sample.process_start_s == pytest.approx(1.79594105315e9)


def test_real_dump_without_model_filter_reads_the_same(vllm_metrics_text: str) -> None:
    assert parse(vllm_metrics_text).counters == parse(vllm_metrics_text, "tiny").counters


def test_sample_is_read_only(vllm_metrics_text: str) -> None:
    sample = parse(vllm_metrics_text)
    with pytest.raises(TypeError):
        sample.counters[CounterName.REQUEST_SUCCESS] = 5.0  # type: ignore[index]


def test_v1_old_names_fixture() -> None:
    text = (DATA_DIR / "vllm-v1-old-names.txt").read_text()
    sample = parse(text, model_name="meta-llama/Llama-3.1-8B-Instruct")
    assert sample.status is SampleStatus.OK
    assert sample.legacy_names == (
        "vllm:gpu_prefix_cache_hits_total",
        "vllm:gpu_prefix_cache_queries_total",
        "vllm:gpu_cache_usage_perc",
        "vllm:time_per_output_token_seconds",
    )
    assert sample.counters[CounterName.REQUEST_SUCCESS] == 100.0  # stop 90 + length 10 + abort 0
    assert sample.histograms[HistogramName.ITL_S] == HistogramTotals(254.0, 12700.0)
    assert sample.gauges[GaugeName.KV_USAGE] == 0.42
    assert sample.gauges[GaugeName.RUNNING] == 3.0
    assert sample.gauges[GaugeName.WAITING] == 1.0


def test_v0_old_names_fixture_without_engine_label() -> None:
    text = (DATA_DIR / "vllm-v0-old-names.txt").read_text()
    sample = parse(text, model_name="facebook/opt-125m")
    assert sample.status is SampleStatus.OK
    assert sample.counters[CounterName.REQUEST_SUCCESS] == 20.0
    assert sample.histograms[HistogramName.ITL_S] == HistogramTotals(19.9, 3980.0)
    assert sample.histograms[HistogramName.TTFT_S] == HistogramTotals(0.3, 20.0)
    assert sample.gauges[GaugeName.KV_USAGE] == 0.05
    assert HistogramName.QUEUE_TIME_S not in sample.histograms  # V0's time_in_queue is not read
    assert sample.process_start_s is None


def test_new_name_wins_when_both_are_exposed() -> None:
    # llm-d-inference-sim exposes both ITL names (ecosystem §1.4); the current one is used.
    new = render(PodTotals(success=2, itl_sum_s=0.5, itl_count=10))
    old = render(PodTotals(success=2, itl_sum_s=9.0, itl_count=10), legacy=True)
    sample = parse(new + old.replace("process_start_time_seconds", "ignored_start"))
    assert sample.histograms[HistogramName.ITL_S] == HistogramTotals(0.5, 10.0)
    assert sample.legacy_names == ()


def test_engines_are_summed_and_kv_usage_is_the_max() -> None:
    totals = steady_increment(
        completions=40,
        in_tokens=100,
        out_tokens=10,
        ttft_s=0.1,
        itl_s=0.01,
        running=6,
        waiting=2,
        kv_usage=0.3,
    )
    sample = parse(render(totals, engines=2))
    assert sample.counters[CounterName.REQUEST_SUCCESS] == pytest.approx(40.0)
    assert sample.histograms[HistogramName.ITL_S].count == pytest.approx(360.0)
    assert sample.gauges[GaugeName.RUNNING] == pytest.approx(6.0)
    assert sample.gauges[GaugeName.KV_USAGE] == pytest.approx(0.3)


def test_model_name_filter_keeps_only_that_model() -> None:
    text = render(PodTotals(success=3), model_name="a") + render(
        PodTotals(success=7), model_name="b"
    ).replace("process_start_time_seconds", "other_start")
    assert parse(text, model_name="b").counters[CounterName.REQUEST_SUCCESS] == 7.0
    assert parse(text).counters[CounterName.REQUEST_SUCCESS] == 10.0


def test_model_name_matching_nothing_is_an_explicit_state(vllm_metrics_text: str) -> None:
    sample = parse(vllm_metrics_text, model_name="llama")
    assert sample.status is SampleStatus.MODEL_NOT_FOUND
    assert not sample.ok
    assert sample.model_names == ("tiny",)
    assert sample.counters == {}


def test_repeated_series_is_counted_once() -> None:
    text = render(PodTotals(success=4))
    line = 'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 3.0'
    sample = parse(text.replace(line, line + "\n" + line))
    assert sample.counters[CounterName.REQUEST_SUCCESS] == 4.0
    assert sample.rejected_samples == 1


def test_exposition_without_vllm_series() -> None:
    sample = parse("# TYPE up gauge\nup 1\n")
    assert sample.status is SampleStatus.NO_VLLM_METRICS


def test_missing_success_counter_is_incomplete() -> None:
    text = render(PodTotals(success=4)).replace("vllm:request_success_total", "vllm:other_total")
    assert parse(text).status is SampleStatus.INCOMPLETE


def test_nan_and_inf_samples_are_rejected_and_counted_never_zero() -> None:
    text = render(PodTotals(success=4, running=2, waiting=1))
    text = text.replace(
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0',
        'vllm:num_requests_running{engine="0",model_name="m"} NaN',
    )
    text = text.replace(
        'vllm:prompt_tokens_total{engine="0",model_name="m"} 0.0',
        'vllm:prompt_tokens_total{engine="0",model_name="m"} +Inf',
    )
    sample = parse(text)
    assert sample.status is SampleStatus.OK
    assert sample.rejected_samples == 2
    assert GaugeName.RUNNING not in sample.gauges
    assert CounterName.PROMPT_TOKENS not in sample.counters
    assert sample.gauges[GaugeName.WAITING] == 1.0


def test_garbage_lines_are_skipped_and_counted(vllm_metrics_text: str) -> None:
    lines = vllm_metrics_text.splitlines()
    lines.insert(10, "this is not { a metric")
    lines.insert(100, 'vllm:num_requests_running{engine="0" 3')
    lines.insert(200, "# TYPE vllm:x notatype")
    sample = parse("\n".join(lines), model_name="tiny")
    assert sample.status is SampleStatus.OK
    assert sample.skipped_lines == 3
    assert sample.counters[CounterName.REQUEST_SUCCESS] == 1.0
    assert sample.histograms[HistogramName.ITL_S].count == 15.0


def test_wrong_family_type_is_rejected() -> None:
    # A counter's samples in a family declared as a gauge: the parser accepts it, we do not.
    text = render(PodTotals(success=4, prompt_tokens=9)).replace(
        "# TYPE vllm:prompt_tokens_total counter", "# TYPE vllm:prompt_tokens_total gauge"
    )
    sample = parse(text)
    assert CounterName.PROMPT_TOKENS not in sample.counters
    assert sample.rejected_samples == 1


def test_histogram_without_count_is_not_used() -> None:
    text = "\n".join(
        line
        for line in render(PodTotals(success=1, ttft_sum_s=1.0, ttft_count=1)).splitlines()
        if not line.startswith("vllm:time_to_first_token_seconds_count")
    )
    assert HistogramName.TTFT_S not in parse(text).histograms


def test_negative_counter_is_rejected() -> None:
    text = render(PodTotals(success=-3.0))
    sample = parse(text)
    assert sample.status is SampleStatus.INCOMPLETE
    assert sample.rejected_samples == 2  # the stop and length series


def test_series_from_prometheus_without_types_are_accepted() -> None:
    series = [
        RawSeries("vllm:request_success_total", {"model_name": "m", "finished_reason": "stop"}, 5),
        RawSeries("vllm:request_success_total", {"model_name": "m", "finished_reason": "abort"}, 1),
        RawSeries("vllm:num_requests_running", {"model_name": "m"}, 3),
        RawSeries("up", {}, 1),
    ]
    sample = sample_from_series(series, pod="p", time_s=1.0, model_name="m")
    assert sample.status is SampleStatus.OK
    assert sample.counters[CounterName.REQUEST_SUCCESS] == 6.0
    assert sample.gauges[GaugeName.RUNNING] == 3.0


def test_wanted_names_cover_old_and_new() -> None:
    names = wanted_sample_names()
    assert {
        "vllm:inter_token_latency_seconds_sum",
        "vllm:time_per_output_token_seconds_count",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "vllm:request_success_total",
        "process_start_time_seconds",
    } <= names


def test_text_that_nothing_parses_is_a_scrape_error_or_empty() -> None:
    sample = parse("\x00\x00\n{}{}\n")
    assert sample.status is SampleStatus.NO_VLLM_METRICS
    assert sample.skipped_lines == 2


_EXPOSITION_ALPHABET = st.sampled_from(
    list('abcvlm:_{}=",# \n\t\\.0123456789+-eEINFaN')
    + [
        "vllm:",
        "_total",
        "_sum",
        "_count",
        "TYPE",
        "HELP",
        "counter",
        "gauge",
        "histogram",
        'model_name="m"',
        "NaN",
        "+Inf",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_EXPOSITION_ALPHABET, max_size=80).map("".join))
def test_random_text_never_crashes_the_parser(text: str) -> None:
    try:
        sample = parse(text)
    except ScrapeError as exc:
        assert exc.reason == "parse"
        return
    assert isinstance(sample.status, SampleStatus)
    assert all(math.isfinite(v) and v >= 0 for v in sample.counters.values())
    assert all(math.isfinite(v) for v in sample.gauges.values())


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=400), min_size=1, max_size=6),
    st.text(max_size=40),
)
def test_real_dump_with_random_lines_inserted_never_crashes(
    positions: list[int], junk: str
) -> None:
    text = (DATA_DIR / "vllm-v1-old-names.txt").read_text()
    lines = text.splitlines()
    for pos in positions:
        lines.insert(min(pos, len(lines)), junk)
    try:
        sample = parse("\n".join(lines))
    except ScrapeError as exc:
        assert exc.reason == "parse"
        return
    assert isinstance(sample.status, SampleStatus)


def test_openmetrics_underscore_spelling_is_read() -> None:
    # prometheus-client 0.26 under OpenMetrics negotiation writes `vllm_...` sample names, so a
    # Prometheus may store either spelling; the canonical one wins when both are present.
    series = [
        RawSeries("vllm_request_success_total", {"model_name": "m"}, 5),
        RawSeries("vllm_num_requests_running", {"model_name": "m"}, 2),
        RawSeries("vllm:num_requests_running", {"model_name": "m"}, 3),
        RawSeries("vllm_time_to_first_token_seconds_sum", {"model_name": "m"}, 1.5),
        RawSeries("vllm_time_to_first_token_seconds_count", {"model_name": "m"}, 10),
    ]
    sample = sample_from_series(series, pod="p", time_s=1.0, model_name="m")
    assert sample.status is SampleStatus.OK
    assert sample.counters[CounterName.REQUEST_SUCCESS] == 5.0
    assert sample.gauges[GaugeName.RUNNING] == 3.0
    assert sample.histograms[HistogramName.TTFT_S] == HistogramTotals(1.5, 10.0)
    assert "vllm_num_requests_running" in wanted_sample_names(escaped=True)
