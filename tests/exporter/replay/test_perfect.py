"""The perfect collector (the closed-loop bench's observer) on a few hand-timed requests.

alpha = 100 ms and negligible beta, gamma: every iteration takes 0.1 s. One replica serves;
a second one is asked for at t = 0 and is ready at 0.5 s. Requests (arrival s, n, m):
r0 (0.05, 10, 3): prefill 0.05-0.15 (first token), decodes end 0.25, 0.35 (done);
r1 (0.12, 10, 2): waits, admitted at 0.15, first token 0.25, done 0.35;
r2 (1.50, 10, 5): first token 1.60, done 2.00 (on replica 0 or 1).
"""

from __future__ import annotations

import numpy as np
import pytest

from exporter.collector.observations import ObservationStatus
from exporter.collector.pod_observation import Problem
from exporter.collector.vllm_metrics import HistogramName
from exporter.replay.perfect import observe_window
from model.queueing.params import ServerConfig, ServiceParams
from model.simulation.simulator import Simulator
from model.simulation.workloads import RequestTrace

KV_CAP = 100


def _fleet() -> Simulator:
    sim = Simulator(
        ServiceParams(100.0, 1e-9, 1e-12),
        ServerConfig(max_batch_size=4, max_num_batched_tokens=100),
        replicas=1,
        kv_capacity_tokens=KV_CAP,
        startup_delay_s=0.5,
        record_iterations=True,
    )
    sim.add_requests(
        RequestTrace(np.array([0.05, 0.12, 1.5]), np.array([10, 10, 10]), np.array([3, 2, 5]))
    )
    sim.set_replicas(2)
    return sim


def test_first_window_counts_rates_latencies_gauges_and_the_new_pod() -> None:
    sim = _fleet()
    start = sim.replica_status()
    samples = []
    for t_s in (0.13, 1.0):
        sim.run(t_s)
        samples.append(sim.replica_status())
    records = sim.drain_records()
    view = observe_window(
        sim.result(), 0.0, 1.0, start, samples, records=records, kv_capacity_tokens=KV_CAP
    )
    obs = view.observation
    assert obs.status is ObservationStatus.OK and obs.success
    assert obs.arrival_rate_rps == pytest.approx(2.0)
    assert obs.completion_rate_rps == pytest.approx(2.0)
    assert obs.avg_input_tokens == pytest.approx(10.0)
    assert obs.avg_output_tokens == pytest.approx(2.5)
    assert obs.ttft_ms == pytest.approx((100.0 + 130.0) / 2, rel=1e-6)
    assert obs.itl_ms == pytest.approx(100.0, rel=1e-6)  # r0: 0.2 s / 2 gaps, r1: 0.1 s / 1
    assert obs.request_tpot_ms == pytest.approx(100.0, rel=1e-6)
    # Replica 1 became ready inside the window: ready, new, not observed over the whole window.
    assert (obs.ready_pods, obs.observed_pods, obs.new_pods) == (2, 1, ("1",))
    assert Problem.NEW_POD in obs.problems
    assert view.replica_starting
    # Gauges over (sample, ready replica): at 0.13 replica 0 runs r0 with r1 waiting; at 1.0
    # both replicas are idle.
    assert obs.avg_running_per_pod == pytest.approx(1 / 3)
    assert obs.avg_waiting_per_pod == pytest.approx(1 / 3)
    assert view.peak_waiting == 1
    assert not obs.queue_growing and obs.backlog_change == 0.0
    assert view.generated_tokens_rps == pytest.approx(5.0)  # 1 + 2 + 2 tokens
    assert view.kv_usage_ratio == 0.0 and view.waiting_requests == 0
    # The length histograms hold the two completed requests (10/3 and 10/2 tokens).
    prompt = obs.windows[HistogramName.PROMPT_LEN]
    output = obs.windows[HistogramName.GENERATION_LEN]
    assert (prompt.count, prompt.sum, output.count, output.sum) == (2.0, 20.0, 2.0, 5.0)
    assert prompt.counts[list(prompt.bounds).index(10.0)] == 2.0  # a bound counts values <= it
    # vLLM's latency histograms in vLLM's buckets, sums exact: TTFTs of 100 and 130 ms (both
    # above 80 ms, at most 250 ms), three gaps of 100 ms (above 75 ms, at most 150 ms).
    ttft = obs.windows[HistogramName.TTFT_S]
    assert (ttft.count, ttft.sum) == pytest.approx((2.0, 0.23), rel=1e-6)
    assert (ttft.share_at_most(0.08), ttft.share_at_most(0.25)) == (0.0, 1.0)
    gaps = obs.windows[HistogramName.ITL_S]
    assert (gaps.count, gaps.sum) == pytest.approx((3.0, 0.3), rel=1e-6)
    assert (gaps.share_at_most(0.075), gaps.share_at_most(0.15)) == (0.0, 1.0)
    assert obs.windows[HistogramName.REQUEST_TPOT_S].count == 2.0


def test_window_without_completions_has_no_latency_and_a_backlog_of_two_is_not_growing() -> None:
    sim = _fleet()
    start = sim.replica_status()
    sim.run(0.3)  # inside the last decode step of r0 and r1 (0.25-0.35)
    view = observe_window(
        sim.result(),
        0.0,
        0.3,
        start,
        [sim.replica_status()],
        records=sim.drain_records(),
        kv_capacity_tokens=KV_CAP,
    )
    obs = view.observation
    assert obs.status is ObservationStatus.NO_LATENCY
    assert obs.request_tpot_ms is None and obs.avg_output_tokens is None
    # vLLM's inter-token latency counts r0's second token (0.15 -> 0.25 s) without a completion.
    assert obs.itl_ms == pytest.approx(100.0, rel=1e-6)
    assert obs.ttft_ms == pytest.approx(115.0, rel=1e-6)  # first tokens of r0 and r1
    # Two arrivals, none done, two more in the system: the collector's backlog test does not
    # fire (a backlog of two more requests is within what light load does between two instants).
    assert not obs.queue_growing and obs.backlog_change == 2.0
    # KV at 0.3 s: r0 holds 10 prompt + 1 decoded token, r1 its 10 prompt tokens.
    assert view.kv_usage_ratio == pytest.approx(21 / KV_CAP)
    assert view.generated_tokens_rps == pytest.approx(10.0)


def test_later_window_sees_only_its_own_requests() -> None:
    sim = _fleet()
    sim.run(1.0)
    sim.drain_records()
    start = sim.replica_status()
    sim.run(2.2)
    view = observe_window(
        sim.result(),
        1.0,
        2.2,
        start,
        [sim.replica_status()],
        records=sim.drain_records(),
        kv_capacity_tokens=KV_CAP,
    )
    obs = view.observation
    assert obs.arrival_rate_rps == pytest.approx(1 / 1.2)
    assert obs.avg_output_tokens == pytest.approx(5.0)
    assert obs.ttft_ms == pytest.approx(100.0, rel=1e-6)
    assert obs.itl_ms == pytest.approx(100.0, rel=1e-6)  # 0.4 s over 4 gaps
    assert view.generated_tokens_rps == pytest.approx(5 / 1.2)
    assert (obs.ready_pods, obs.observed_pods, obs.new_pods) == (2, 2, ())
    assert not view.replica_starting


def test_window_must_have_a_length_and_samples() -> None:
    sim = _fleet()
    res, status = sim.run(1.0), sim.replica_status()
    with pytest.raises(ValueError, match=r"`end_s` must be > start_s"):
        observe_window(res, 1.0, 1.0, status, [status], records=[])
    with pytest.raises(ValueError, match=r"`samples` must hold"):
        observe_window(res, 0.0, 1.0, status, [], records=[])


def test_itl_is_the_windows_token_gaps_and_tpot_the_completed_requests_lifetimes() -> None:
    # Iterations take 100 ms + 10 ms per token. r0 (20 output tokens) decodes beside r1-r3
    # (4 tokens each) until they finish, then alone: 110 ms a token. A window from 1.0 s sees
    # only r0 alone; r0, finishing in it, carries its fuller-batch start into its own time per
    # output token, as a completed request's does under any load change.
    sim = Simulator(
        ServiceParams(100.0, 10.0, 1e-12),
        ServerConfig(max_batch_size=4, max_num_batched_tokens=100),
        replicas=1,
        kv_capacity_tokens=KV_CAP,
        record_iterations=True,
    )
    sim.add_requests(RequestTrace(np.zeros(4), np.ones(4, dtype=int), np.array([20, 4, 4, 4])))
    sim.run(1.0)
    sim.drain_records()
    start = sim.replica_status()
    sim.run(3.0)
    view = observe_window(
        sim.result(), 1.0, 3.0, start, [sim.replica_status()], records=sim.drain_records(),
        kv_capacity_tokens=KV_CAP,
    )  # fmt: skip
    obs = view.observation
    assert obs.completion_rate_rps == pytest.approx(0.5)  # r0 alone finished in the window
    assert obs.itl_ms == pytest.approx(110.0, rel=1e-6)
    assert obs.request_tpot_ms == pytest.approx(float(sim.result().itl_ms[0]))
    assert obs.request_tpot_ms > 1.02 * obs.itl_ms
