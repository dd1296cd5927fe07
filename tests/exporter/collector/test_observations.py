"""Observation builder: hand-computed windows (steady, reset, churn, empty, partial, garbage)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from functools import partial

import pytest

from exporter.base.clock import ManualClock
from exporter.base.errors import FailureReason
from exporter.collector.observations import (
    STATUS_MESSAGES,
    ObservationStatus,
    WindowTracker,
    observe_deployment,
)
from exporter.collector.pod_observation import Problem, observe_pod
from exporter.collector.saturation import Saturation
from exporter.collector.sources import PodFailure, ScrapeSource, SourceRead
from exporter.collector.vllm_metrics import CounterName, PodSample, SampleStatus, parse_exposition
from model.calibration.kv_context import KvContext
from tests.fixtures.metrics_server import Behaviour, MetricsServer
from tests.fixtures.vllm_exposition import PodTotals, render, steady_increment

T0 = 1_700_000_000.0
W = 60.0


def sample(pod: str, totals: PodTotals, time_s: float, model: str | None = None) -> PodSample:
    return parse_exposition(render(totals), pod=pod, time_s=time_s, model_name=model)


def read(time_s: float, *samples: PodSample, failures: tuple[PodFailure, ...] = ()) -> SourceRead:
    return SourceRead(time_s=time_s, samples=samples, failures=failures)


# Pod a: 120 requests of 512 in / 128 out, TTFT 0.1 s, ITL 0.01 s; pod b: 60 of 256 / 64,
# TTFT 0.2 s, ITL 0.02 s. Each request has out-1 token gaps in the ITL histogram.
POD_A = steady_increment(
    completions=120,
    in_tokens=512,
    out_tokens=128,
    ttft_s=0.1,
    itl_s=0.01,
    queue_s=0.05,
    inference_s=2.0,
    running=4,
    waiting=0,
    kv_usage=0.2,
)
POD_B = steady_increment(
    completions=60,
    in_tokens=256,
    out_tokens=64,
    ttft_s=0.2,
    itl_s=0.02,
    queue_s=0.0,
    inference_s=1.5,
    running=2,
    waiting=0,
    kv_usage=0.4,
)
BASE = PodTotals(
    success=1000,
    ttft_sum_s=50,
    ttft_count=1000,
    itl_sum_s=900,
    itl_count=90000,
    prompt_len_sum=4e5,
    prompt_len_count=1000,
    gen_len_sum=1e5,
    gen_len_count=1000,
    running=4,
    waiting=0,
)


def steady_reads() -> tuple[SourceRead, SourceRead]:
    a0, b0 = BASE.plus(POD_A, times=0), BASE.plus(POD_B, times=0)
    start = read(T0, sample("a", a0, T0), sample("b", b0, T0))
    end = read(T0 + W, sample("a", a0.plus(POD_A), T0 + W), sample("b", b0.plus(POD_B), T0 + W))
    return start, end


def test_steady_load_two_pods() -> None:
    obs = observe_deployment(*steady_reads(), deployment="llama")
    assert obs.success and obs.status is ObservationStatus.OK
    assert obs.message == STATUS_MESSAGES[ObservationStatus.OK]
    assert obs.deployment == "llama" and obs.window_s == W
    assert (obs.ready_pods, obs.observed_pods) == (2, 2)
    assert obs.completion_rate_rps == pytest.approx(180 / 60)
    assert obs.arrival_rate_rps == pytest.approx(180 / 60)  # gauges unchanged: no backlog change
    assert obs.arrival_rate_per_pod_rps == pytest.approx(1.5)
    assert obs.avg_input_tokens == pytest.approx((120 * 512 + 60 * 256) / 180)  # 426.667
    assert obs.avg_output_tokens == pytest.approx((120 * 128 + 60 * 64) / 180)  # 106.667
    assert obs.ttft_ms == pytest.approx(1000 * (120 * 0.1 + 60 * 0.2) / 180)  # 133.333
    gaps_a, gaps_b = 120 * 127, 60 * 63
    assert obs.itl_ms == pytest.approx(1000 * (gaps_a * 0.01 + gaps_b * 0.02) / (gaps_a + gaps_b))
    assert obs.request_tpot_ms == pytest.approx(1000 * (120 * 0.01 + 60 * 0.02) / 180)
    # Little: running = time in RUNNING per second of window: a 120*2/60 = 4, b 60*1.5/60 = 1.5.
    assert obs.avg_running_per_pod == pytest.approx((4.0 + 1.5) / 2)
    assert obs.avg_waiting_per_pod == pytest.approx((120 * 0.05 / 60 + 0.0) / 2)
    assert obs.kv_cache_usage_ratio == pytest.approx(0.3)
    assert obs.max_kv_cache_usage_ratio == pytest.approx(0.4)
    assert not obs.queue_growing and obs.problems == () and obs.saturation == ()
    pod_a = obs.pods[0]
    assert pod_a.pod == "a" and pod_a.completed == 120
    assert pod_a.ttft_ms == pytest.approx(100.0) and pod_a.itl_ms == pytest.approx(10.0)
    assert pod_a.avg_input_tokens == pytest.approx(512) and pod_a.avg_output_tokens == 128


def test_arrivals_by_conservation_and_growing_backlog() -> None:
    # Scenario J10: 100 completions in 60 s while N rises from 10 to 30.
    start = sample("a", PodTotals(success=500, running=8, waiting=2), T0)
    end = sample("a", PodTotals(success=600, running=16, waiting=14), T0 + W)
    pod = observe_pod(start, end)
    assert pod.completion_rate_rps == pytest.approx(100 / 60)
    assert pod.arrival_rate_rps == pytest.approx(120 / 60)  # 120 RPM
    assert pod.backlog_change == 20
    assert pod.queue_growing


def with_preemptions(text: str, count: float) -> str:
    return text + (
        "# TYPE vllm:num_preemptions_total counter\n"
        f'vllm:num_preemptions_total{{engine="0",model_name="m"}} {count}\n'
    )


def test_saturation_signs() -> None:
    # 60 completions that each waited 3 s in the queue and ran 2 s: mean waiting = 3 s x 1 req/s
    # = 3 (> 0.5), queue time > inference time; KV at 0.97; 4 preemptions; backlog +20.
    start = PodTotals(success=100, running=10, waiting=0)
    end = start.plus(
        steady_increment(completions=60, in_tokens=1000, out_tokens=100, ttft_s=3.5, itl_s=0.02,
                         queue_s=3.0, inference_s=2.0, running=16, waiting=14, kv_usage=0.97)
    )  # fmt: skip
    pod = observe_pod(
        parse_exposition(with_preemptions(render(start), 1), pod="a", time_s=T0),
        parse_exposition(with_preemptions(render(end), 5), pod="a", time_s=T0 + W),
    )
    assert not pod.reset
    assert pod.avg_waiting == pytest.approx(3.0) and pod.backlog_change == 20
    assert pod.saturation == tuple(Saturation)
    calm = observe_pod(
        parse_exposition(with_preemptions(render(BASE), 1), pod="a", time_s=T0),
        parse_exposition(with_preemptions(render(BASE.plus(POD_A)), 1), pod="a", time_s=T0 + W),
    )
    assert calm.saturation == ()


def test_draining_backlog_clamps_arrivals_to_completions() -> None:
    start = sample("a", PodTotals(success=500, running=16, waiting=14), T0)
    end = sample("a", PodTotals(success=600, running=8, waiting=2), T0 + W)
    pod = observe_pod(start, end)
    assert pod.backlog_change == -20
    assert pod.arrival_rate_rps == pytest.approx(100 / 60)  # clamped, collector-spec §7.4
    assert not pod.queue_growing


def test_one_arrival_at_an_idle_pod_is_not_a_growing_queue() -> None:
    pod = observe_pod(sample("a", PodTotals(), T0), sample("a", PodTotals(running=1), T0 + W))
    assert pod.arrival_rate_rps == pytest.approx(1 / 60)
    assert not pod.queue_growing


def test_counter_reset_mid_window_counts_from_zero() -> None:
    before = BASE.plus(POD_A, times=10)  # 2200 completions so far
    # The pod restarts; after the restart it completes 30 requests of TTFT 0.3 s.
    # (`plus` takes instant values such as the start time from its argument: set it after.)
    after = replace(
        PodTotals().plus(
            steady_increment(
                completions=30,
                in_tokens=100,
                out_tokens=11,
                ttft_s=0.3,
                itl_s=0.05,
                running=3,
                waiting=1,
            )
        ),
        process_start_s=BASE.process_start_s + 45,
    )
    pod = observe_pod(sample("a", before, T0), sample("a", after, T0 + W))
    assert pod.reset and Problem.COUNTER_RESET in pod.problems
    assert pod.completed == 30
    assert pod.completion_rate_rps == pytest.approx(0.5)
    assert pod.arrival_rate_rps == pytest.approx((30 + 4) / 60)  # backlog from zero after restart
    assert pod.ttft_ms == pytest.approx(300.0)
    assert pod.itl_ms == pytest.approx(50.0)
    assert pod.avg_input_tokens == pytest.approx(100.0)


def test_counter_decrease_without_start_time_is_a_reset() -> None:
    success = CounterName.REQUEST_SUCCESS
    start = PodSample(pod="a", time_s=T0, status=SampleStatus.OK, counters={success: 900.0})
    end = PodSample(pod="a", time_s=T0 + W, status=SampleStatus.OK, counters={success: 12.0})
    pod = observe_pod(start, end)
    assert pod.reset and pod.completed == 12
    assert pod.completion_rate_rps == pytest.approx(0.2)
    assert Problem.MISSING_GAUGES in pod.problems  # no gauges: arrivals = completions
    assert pod.arrival_rate_rps == pytest.approx(0.2)
    assert pod.ttft_ms is None and pod.itl_ms is None


def test_restart_that_outgrew_the_old_counter_is_caught_by_start_time() -> None:
    before = PodTotals(success=10, ttft_sum_s=1.0, ttft_count=10)
    after = PodTotals(success=40, ttft_sum_s=8.0, ttft_count=40, process_start_s=T0 + 5)
    pod = observe_pod(sample("a", before, T0), sample("a", after, T0 + W))
    assert pod.reset and pod.completed == 40
    assert pod.ttft_ms == pytest.approx(200.0)


def test_pod_appearing_and_pod_disappearing() -> None:
    a = BASE.plus(POD_A, times=0)
    start = read(T0, sample("a", a, T0), sample("b", BASE, T0))
    end = read(T0 + W, sample("a", a.plus(POD_A), T0 + W), sample("c", BASE, T0 + W))
    obs = observe_deployment(start, end)
    assert obs.status is ObservationStatus.OK
    assert [p.pod for p in obs.pods] == ["a"]
    assert obs.new_pods == ("c",) and obs.gone_pods == ("b",)
    assert (obs.ready_pods, obs.observed_pods) == (2, 1)
    assert obs.completion_rate_rps == pytest.approx(2.0)  # pod a only: 120 / 60
    assert obs.arrival_rate_per_pod_rps == pytest.approx(2.0)
    assert obs.kv_cache_usage_ratio == pytest.approx(0.1)  # end KV of a (0.2) and c (0.0)
    assert {Problem.NEW_POD, Problem.GONE_POD} <= set(obs.problems)


def test_empty_window_has_no_latency_observation() -> None:
    start = read(T0, sample("a", BASE, T0))
    end = read(T0 + W, sample("a", BASE, T0 + W))
    obs = observe_deployment(start, end)
    assert obs.success and obs.status is ObservationStatus.NO_LATENCY
    assert obs.arrival_rate_rps == 0.0 and obs.completion_rate_rps == 0.0
    for value in (obs.ttft_ms, obs.itl_ms, obs.avg_input_tokens, obs.avg_output_tokens):
        assert value is None  # never a zero
    assert Problem.NO_COMPLETIONS in obs.problems


def test_window_with_arrivals_but_no_completions() -> None:
    start = read(T0, sample("a", BASE, T0))
    end = read(T0 + W, sample("a", BASE.plus(PodTotals(running=7, waiting=3)), T0 + W))
    obs = observe_deployment(start, end)
    assert obs.status is ObservationStatus.NO_LATENCY
    assert obs.arrival_rate_rps == pytest.approx((10 - 4) / 60)  # N from 4 to 10
    assert obs.ttft_ms is None and obs.queue_growing


def test_idle_pod_adds_throughput_weight_but_no_latency() -> None:
    # Scenario H3-like: pod b completes nothing, so the latency means are pod a's alone.
    start = read(T0, sample("a", BASE, T0), sample("b", BASE, T0))
    end = read(T0 + W, sample("a", BASE.plus(POD_A), T0 + W), sample("b", BASE, T0 + W))
    obs = observe_deployment(start, end)
    assert obs.status is ObservationStatus.OK
    assert obs.ttft_ms == pytest.approx(100.0) and obs.itl_ms == pytest.approx(10.0)
    assert obs.completion_rate_rps == pytest.approx(2.0)
    assert obs.pods[1].ttft_ms is None


def test_first_read_is_warming_up_then_ok() -> None:
    tracker = WindowTracker("llama")
    start, end = steady_reads()
    first = tracker.observe(start)
    assert not first.success and first.status is ObservationStatus.WARMING_UP
    assert first.new_pods == ("a", "b") and first.ttft_ms is None
    second = tracker.observe(end)
    assert second.status is ObservationStatus.OK and second.deployment == "llama"
    assert second.completion_rate_rps == pytest.approx(3.0)


def test_no_pods() -> None:
    failure = PodFailure("a", FailureReason.TIMEOUT, "timed out")
    obs = observe_deployment(read(T0), read(T0 + W, failures=(failure,)))
    assert not obs.success and obs.status is ObservationStatus.NO_PODS
    assert obs.failures == (failure,) and Problem.FAILED_POD in obs.problems


def test_model_name_matching_nothing_is_an_error_state(caplog: pytest.LogCaptureFixture) -> None:
    start = read(T0, sample("a", BASE, T0, model="other"))
    end = read(T0 + W, sample("a", BASE.plus(POD_A), T0 + W, model="other"))
    obs = observe_deployment(start, end, deployment="llama")
    assert "llama: the configured model_name matches no pod" in caplog.text
    assert "pods expose: m" in caplog.text
    assert not obs.success and obs.status is ObservationStatus.MODEL_NOT_FOUND
    assert obs.arrival_rate_rps == 0.0 and obs.ttft_ms is None
    assert Problem.MODEL_NOT_FOUND in obs.problems


def test_token_means_fall_back_to_counters_without_histograms() -> None:
    start = PodTotals(success=10, prompt_tokens=1000, generation_tokens=500)
    end = PodTotals(success=30, prompt_tokens=7000, generation_tokens=2500)
    text_start = _without(render(start), "vllm:request_prompt_tokens", "vllm:request_generation")
    text_end = _without(render(end), "vllm:request_prompt_tokens", "vllm:request_generation")
    pod = observe_pod(
        parse_exposition(text_start, pod="a", time_s=T0),
        parse_exposition(text_end, pod="a", time_s=T0 + W),
    )
    assert pod.avg_input_tokens == pytest.approx(6000 / 20)
    assert pod.avg_output_tokens == pytest.approx(2000 / 20)


def test_occupancy_from_gauges_without_phase_histograms() -> None:
    start = _without(
        render(PodTotals(success=1, running=2, waiting=4)),
        "vllm:request_inference",
        "vllm:request_queue",
    )
    end = _without(
        render(PodTotals(success=9, running=6, waiting=0)),
        "vllm:request_inference",
        "vllm:request_queue",
    )
    pod = observe_pod(
        parse_exposition(start, pod="a", time_s=T0), parse_exposition(end, pod="a", time_s=T0 + W)
    )
    assert pod.avg_running == pytest.approx(4.0) and pod.avg_waiting == pytest.approx(2.0)


def test_observe_pod_rejects_bad_input() -> None:
    a = sample("a", BASE, T0)
    with pytest.raises(ValueError, match=r"`end.time_s` must be after `start.time_s`"):
        observe_pod(a, a)
    bad = sample("a", BASE, T0 + W, model="x")
    with pytest.raises(ValueError, match=r"both samples must be OK, got ok and model_not_found"):
        observe_pod(a, bad)


def _without(text: str, *prefixes: str) -> str:
    kept = [line for line in text.splitlines() if not any(p in line for p in prefixes)]
    return "\n".join(kept) + "\n"


# --- over real loopback HTTP -----------------------------------------------------------------


@pytest.fixture
def two_pods() -> Iterator[tuple[dict[str, PodTotals], list[MetricsServer]]]:
    state = {"a": BASE, "b": BASE}
    servers = [MetricsServer(partial(lambda k: render(state[k]), key)).start() for key in "ab"]
    yield state, servers
    for server in servers:
        server.stop()


@pytest.mark.integration  # real HTTP on 127.0.0.1
def test_partial_scrape_one_pod_times_out(
    two_pods: tuple[dict[str, PodTotals], list[MetricsServer]],
) -> None:
    state, servers = two_pods
    clock = ManualClock(T0)
    source = ScrapeSource(clock=clock, urls=[s.url for s in servers], timeout_s=1.0)
    tracker = WindowTracker("llama")
    tracker.observe(source.read())
    clock.advance(W)
    state["a"] = state["a"].plus(POD_A)
    state["b"] = state["b"].plus(POD_B)
    servers[1].behaviour = Behaviour.HANG
    obs = tracker.observe(source.read())
    assert obs.status is ObservationStatus.OK
    assert [p.pod for p in obs.pods] == [servers[0].target]
    # The hung pod still exists and serves: its load is estimated from the other's (2 req/s),
    # never taken as zero; latencies are the observed pod's.
    assert obs.completion_rate_rps == pytest.approx(4.0) and obs.ttft_ms == pytest.approx(100.0)
    assert obs.ready_pods == 2 and obs.unobserved_pods == 1
    assert obs.gone_pods == (servers[1].target,)
    assert [(f.pod, f.reason) for f in obs.failures] == [(servers[1].target, FailureReason.TIMEOUT)]
    assert Problem.FAILED_POD in obs.problems


@pytest.mark.integration  # real HTTP on 127.0.0.1
def test_nan_and_garbage_lines_over_http(
    two_pods: tuple[dict[str, PodTotals], list[MetricsServer]],
) -> None:
    state, servers = two_pods
    clock = ManualClock(T0)
    source = ScrapeSource(clock=clock, urls=[servers[0].url], timeout_s=2.0)
    start = source.read()
    clock.advance(W)
    state["a"] = state["a"].plus(POD_A)
    clean = render(state["a"])
    servers[0].body = lambda: (
        "garbage {{{ line\n"
        + clean.replace(
            'vllm:num_requests_running{engine="0",model_name="m"} 4.0',
            'vllm:num_requests_running{engine="0",model_name="m"} NaN',
        )
        + 'vllm:num_requests_waiting{engine="0" oops\n'
    )
    end = source.read()
    # The garbage line names no vLLM family: the read streams past it unparsed (a scrape keeps
    # only the lines it reads), so only the broken vLLM line counts as skipped.
    assert end.samples[0].skipped_lines == 1 and end.samples[0].rejected_samples == 1
    obs = observe_deployment(start, end)
    assert obs.status is ObservationStatus.OK
    assert (obs.skipped_lines, obs.rejected_samples) == (1, 1)
    assert obs.completion_rate_rps == pytest.approx(2.0)
    assert obs.arrival_rate_rps == pytest.approx(2.0)  # running is NaN: completions only
    assert Problem.MISSING_GAUGES in obs.problems
    assert obs.ttft_ms == pytest.approx(100.0) and obs.itl_ms == pytest.approx(10.0)


def test_requests_in_flight_sum_running_and_waiting_at_the_end_of_the_window() -> None:
    start, end = steady_reads()
    busy = observe_deployment(start, end)
    assert busy.requests_in_flight == pytest.approx(4 + 2)  # running + waiting of a and b
    idle = PodTotals(success=10, running=0, waiting=0)
    quiet = observe_deployment(
        read(T0, sample("a", idle, T0)), read(T0 + W, sample("a", idle, T0 + W))
    )
    assert quiet.requests_in_flight == 0.0 and quiet.arrival_rate_rps == 0.0
    # A pod without the gauges: unknown, never 0.
    blind = parse_exposition(
        _without(render(idle), "vllm:num_requests_running"), pod="a", time_s=T0 + W
    )
    unknown = observe_deployment(read(T0, sample("a", idle, T0)), read(T0 + W, blind))
    assert unknown.requests_in_flight is None


def test_the_kv_running_requests_hold_is_summed_over_pods_unless_a_window_preempted() -> None:
    capacity = 100_000.0

    def with_capacity(r: SourceRead, preempted: float) -> SourceRead:
        samples = tuple(
            replace(
                s,
                kv_capacity_tokens=capacity,
                counters={**s.counters, CounterName.PREEMPTIONS: preempted if s.pod == "a" else 0},
            )
            for s in r.samples
        )
        return replace(r, samples=samples)

    start, end = steady_reads()
    # Pod a holds 0.2 of its cache with 4 running, pod b 0.4 with 2, at the window's end.
    obs = observe_deployment(with_capacity(start, 0), with_capacity(end, 0))
    assert obs.kv_context == KvContext(0.2 * capacity + 0.4 * capacity, 6.0)
    assert obs.pods[0].kv_context == KvContext(0.2 * capacity, 4.0)
    # Pod a preempted in the window: its KV is being recomputed, only b's is read.
    preempting = observe_deployment(with_capacity(start, 0), with_capacity(end, 2))
    assert preempting.kv_context == KvContext(0.4 * capacity, 2.0)
    # Without the cache's size (no cache_config_info): no reading.
    assert observe_deployment(start, end).kv_context is None
