"""Simulator: hand-checked scheduler cases, tie order, preemption, fleet, invariants."""

from __future__ import annotations

import math

import numpy as np
import pytest

from model.queueing.params import ServerConfig, ServiceParams
from model.simulation.replica import ReplicaState
from model.simulation.simulator import Priority, Router, Simulator, simulate
from model.simulation.workloads import LengthDist, LengthKind, RequestTrace, poisson_trace

# Round numbers so every iteration time is exact in binary floating point where it matters.
TOY = ServiceParams(alpha_ms=1.0, beta_ms=0.1, gamma_ms=0.01)
LLAMA = ServiceParams(alpha_ms=6.68, beta_ms=2.01e-2, gamma_ms=5.52e-5)


def trace(arrival_s: list[float], n_in: list[int], n_out: list[int]) -> RequestTrace:
    return RequestTrace(np.array(arrival_s), np.array(n_in), np.array(n_out))


def run_records(server: ServerConfig, tr: RequestTrace, params: ServiceParams = TOY, **kw: object):
    sim = Simulator(params, server, record_iterations=True, **kw)  # type: ignore[arg-type]
    sim.add_requests(tr)
    result = sim.run()
    return result, sim.drain_records()


def test_single_request_chunked_prefill_exact_times() -> None:
    # 20-token prompt, M = 8: chunks 8, 8, 4 read 8, 16, 20 KV tokens; then 2 decode steps
    # (output tokens 2 and 3) read 21 and 22.
    result, records = run_records(ServerConfig(4, 8), trace([0.0], [20], [3]))
    times = [1 + 0.8 + 0.08, 1 + 0.8 + 0.16, 1 + 0.4 + 0.20, 1 + 0.1 + 0.21, 1 + 0.1 + 0.22]
    ends = np.cumsum(times)
    got = []
    for rec in records:
        got.extend([rec.tokens_per_iteration] * rec.iterations)
    assert got == [8, 8, 4, 1, 1]
    assert result.ttft_ms[0] == pytest.approx(ends[2], abs=1e-9)
    assert result.e2e_ms[0] == pytest.approx(ends[4], abs=1e-9)
    assert result.itl_ms[0] == pytest.approx((ends[4] - ends[2]) / 2, abs=1e-9)
    assert result.queue_ms[0] == 0.0


def test_two_requests_share_the_budget_and_the_batch() -> None:
    # A (10 in, 3 out) at 0; B (3 in, 2 out) arrives during A's first chunk.
    result, records = run_records(ServerConfig(2, 8), trace([0.0, 0.001], [10, 3], [3, 2]))
    it1 = 1 + 0.1 * 8 + 0.01 * 8  # A: 8-token chunk
    it2 = 1 + 0.1 * (2 + 3) + 0.01 * (10 + 3)  # A: last 2 prompt tokens; B admitted: 3
    it3 = 1 + 0.1 * 2 + 0.01 * (11 + 4)  # both decode
    it4 = 1 + 0.1 * 1 + 0.01 * 12  # A alone
    assert [r.tokens_per_iteration for r in records] == [8, 5, 2, 1]
    assert result.ttft_ms == pytest.approx([it1 + it2, it1 + it2 - 1.0], abs=1e-9)
    assert result.queue_ms == pytest.approx([0.0, it1 - 1.0], abs=1e-9)
    assert result.e2e_ms == pytest.approx([it1 + it2 + it3 + it4, it1 + it2 + it3 - 1.0])
    assert result.itl_ms[1] == pytest.approx(it3)
    assert result.iterations == 4


def test_partial_chunk_for_a_waiting_prompt_and_fcfs() -> None:
    # Three prompts of 5 at t=0 with M = 8: iteration 1 gives 5 + 3 (partial), C waits.
    result, records = run_records(ServerConfig(3, 8), trace([0, 0, 0], [5, 5, 5], [1, 1, 1]))
    it1 = 1 + 0.8 + 0.01 * (5 + 3)
    it2 = 1 + 0.1 * (2 + 5) + 0.01 * (5 + 5)  # B's last 2, then C whole
    assert [r.tokens_per_iteration for r in records] == [8, 7]
    assert result.ttft_ms == pytest.approx([it1, it1 + it2, it1 + it2], abs=1e-9)
    assert result.queue_ms == pytest.approx([0.0, 0.0, it1], abs=1e-9)
    assert np.isnan(result.itl_ms).all()  # one output token: no gap


def test_batch_cap_holds_back_the_third_request() -> None:
    result, _ = run_records(ServerConfig(2, 64), trace([0, 0, 0], [4, 4, 4], [2, 2, 2]))
    it1 = 1 + 0.8 + 0.08
    it2 = 1 + 0.2 + 0.01 * (5 + 5)
    assert result.queue_ms == pytest.approx([0.0, 0.0, it1 + it2], abs=1e-9)


def test_arrival_at_an_iteration_end_joins_the_next_iteration() -> None:
    params = ServiceParams(alpha_ms=1.0, beta_ms=0.5, gamma_ms=0.25)
    first = 1.0 + 0.5 * 2 + 0.25 * 2  # 2.5 ms, exact in binary
    result, records = run_records(
        ServerConfig(4, 64), trace([0.0, first / 1000.0], [2, 2], [1, 1]), params
    )
    assert result.queue_ms[1] == 0.0
    assert [r.tokens_per_iteration for r in records] == [2, 2]


def test_priority_order_is_ready_then_arrival_then_iteration_end() -> None:
    assert Priority.REPLICA_READY < Priority.ARRIVAL < Priority.ITERATION_END


def test_a_replica_ready_at_an_arrival_instant_can_take_it() -> None:
    sim = Simulator(TOY, ServerConfig(4, 64), replicas=1, startup_delay_s=1.0,
                    router=Router.LEAST_LOADED)
    sim.set_replicas(2)  # replica 1 ready at exactly t = 1.0
    sim.add_requests(trace([0.0, 1.0], [4, 4], [5000, 2]))
    result = sim.run()
    assert list(result.replica) == [0, 1]  # replica 0 is busy; the new one is idle
    assert result.queue_ms[1] == 0.0


def test_kv_capacity_preempts_the_newest_and_recomputes() -> None:
    # Two requests of 4 + 6 tokens each need 20 KV tokens at the end; capacity 14.
    result, records = run_records(
        ServerConfig(4, 64), trace([0.0, 0.0], [4, 4], [6, 6]), kv_capacity_tokens=14
    )
    assert result.completed == 2
    assert list(result.request_preemptions) == [0, 1]
    assert result.finish_s[1] > result.finish_s[0]
    assert sum(r.preemptions for r in records) == 1
    # B recomputes its prompt plus the tokens it had produced, in one prefill.
    assert max(r.tokens_per_iteration for r in records[2:]) > 4


def test_request_longer_than_the_kv_cache_is_rejected() -> None:
    result = simulate(TOY, ServerConfig(4, 64), trace([0.0], [10], [10]), kv_capacity_tokens=15)
    assert (result.rejected, result.completed, result.in_system) == (1, 0, 0)


def test_queue_limit_rejects_arrivals() -> None:
    server = ServerConfig(1, 64, max_queue_size=1)
    result = simulate(TOY, server, trace([0, 0.001, 0.002, 0.003], [4] * 4, [50] * 4))
    assert result.rejected == 2
    assert result.completed == 2


@pytest.fixture
def poisson_1k() -> RequestTrace:
    rng = np.random.default_rng(7)
    lengths_in = LengthDist(LengthKind.UNIFORM, 512)
    lengths_out = LengthDist(LengthKind.UNIFORM, 128)
    return poisson_trace(8.0, 120.0, lengths_in, lengths_out, rng)


@pytest.mark.parametrize(
    ("server", "kwargs"),
    [
        (ServerConfig(256, 8192), {}),
        (ServerConfig(32, 1024), {"replicas": 2, "router": Router.LEAST_LOADED,
                                  "kv_capacity_tokens": 12_000}),
    ],
    ids=["one-replica", "fleet-kv-limited"],
)
def test_decode_runs_in_one_step_match_iteration_by_iteration(
    poisson_1k: RequestTrace, server: ServerConfig, kwargs: dict[str, object]
) -> None:
    fast = Simulator(LLAMA, server, **kwargs)  # type: ignore[arg-type]
    slow = Simulator(LLAMA, server, max_jump_s=1e-12, **kwargs)  # type: ignore[arg-type]
    for sim in (fast, slow):
        sim.add_requests(poisson_1k)
    a, b = fast.run(), slow.run()
    assert a.iterations == b.iterations
    assert a.preemptions == b.preemptions
    np.testing.assert_allclose(a.ttft_ms, b.ttft_ms, rtol=1e-9)
    np.testing.assert_allclose(a.e2e_ms, b.e2e_ms, rtol=1e-9)


def test_seed_reproduces_and_requests_are_never_lost(poisson_1k: RequestTrace) -> None:
    server = ServerConfig(64, 2048)
    sim = Simulator(LLAMA, server, replicas=2, router=Router.LEAST_LOADED)
    sim.add_requests(poisson_1k)
    mid = sim.run(60.0)
    held = sum(s.running + s.waiting for s in sim.replica_status())
    assert mid.arrived == int(np.count_nonzero(poisson_1k.arrival_s <= 60.0))
    assert mid.arrived == mid.completed + mid.in_system + mid.rejected
    assert mid.in_system == held
    end = sim.run()
    assert (end.completed, end.in_system) == (len(poisson_1k), 0)
    again = simulate(LLAMA, server, poisson_1k, replicas=2, router=Router.LEAST_LOADED)
    np.testing.assert_array_equal(again.ttft_ms, end.ttft_ms)


def test_ttft_grows_with_the_arrival_rate() -> None:
    server = ServerConfig(256, 8192)
    means = []
    for rate in (2.0, 8.0, 16.0):
        rng = np.random.default_rng(3)
        n_in, n_out = LengthDist(LengthKind.UNIFORM, 1024), LengthDist(LengthKind.UNIFORM, 256)
        tr = poisson_trace(rate, 200.0, n_in, n_out, rng)
        means.append(float(np.nanmean(simulate(LLAMA, server, tr).ttft_ms)))
    assert means == sorted(means)


def test_round_robin_alternates_and_least_loaded_balances() -> None:
    tr = trace([0.0, 0.0, 0.0, 0.0], [4] * 4, [3] * 4)
    rr = simulate(TOY, ServerConfig(4, 64), tr, replicas=2)
    assert list(rr.replica) == [0, 1, 0, 1]
    ll = simulate(TOY, ServerConfig(4, 64), tr, replicas=3, router=Router.LEAST_LOADED)
    assert list(ll.replica) == [0, 1, 2, 0]


def test_added_replica_serves_only_after_its_startup_delay() -> None:
    sim = Simulator(TOY, ServerConfig(4, 64), replicas=1, startup_delay_s=1.0,
                    router=Router.LEAST_LOADED)
    sim.add_requests(trace([0.1 * k for k in range(30)], [4] * 30, [200] * 30))
    sim.run(0.5)
    sim.set_replicas(2)
    assert [s.state for s in sim.replica_status()] == [ReplicaState.READY, ReplicaState.STARTING]
    result = sim.run()
    on_new = result.replica == 1
    assert on_new.any()
    assert result.arrival_s[on_new].min() >= 1.5


def test_removed_replica_drains_then_disappears() -> None:
    sim = Simulator(TOY, ServerConfig(4, 64), replicas=2)
    sim.add_requests(trace([0.0, 0.0, 0.01, 0.02, 0.03], [4] * 5, [300] * 5))
    sim.run(0.005)
    sim.set_replicas(1)
    assert sim.replica_status()[1].state is ReplicaState.DRAINING
    result = sim.run()
    assert result.completed == 5
    assert list(result.replica[2:]) == [0, 0, 0]  # no new work for the draining replica
    assert sim.replica_status()[1].state is ReplicaState.REMOVED


def test_scale_from_zero_holds_arrivals_until_a_replica_is_ready() -> None:
    sim = Simulator(TOY, ServerConfig(4, 64), replicas=0, startup_delay_s=2.0)
    sim.add_requests(trace([0.5], [4], [2]))
    sim.set_replicas(1)
    result = sim.run()
    assert result.completed == 1
    assert result.ttft_ms[0] > 1500.0


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"replicas": -1}, r"`replicas`.*got -1"),
        ({"kv_capacity_tokens": 0}, r"`kv_capacity_tokens`.*got 0"),
        ({"startup_delay_s": -1.0}, r"`startup_delay_s`.*got -1"),
        ({"max_jump_s": 0.0}, r"`max_jump_s`.*got 0"),
    ],
)
def test_bad_arguments_name_the_field(kwargs: dict[str, object], pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        Simulator(TOY, ServerConfig(), **kwargs)  # type: ignore[arg-type]


def test_requests_must_not_arrive_in_the_past() -> None:
    sim = Simulator(TOY, ServerConfig())
    sim.run(5.0)
    with pytest.raises(ValueError, match=r"`arrival_s`.*got 1.0"):
        sim.add_requests(trace([1.0], [4], [4]))


def test_peek_reports_the_next_event() -> None:
    sim = Simulator(TOY, ServerConfig())
    assert sim.peek() == math.inf
    sim.add_requests(trace([0.25], [4], [4]))
    assert sim.peek() == 0.25


def test_budget_is_respected_and_every_token_is_computed_once(poisson_1k: RequestTrace) -> None:
    server = ServerConfig(16, 512)
    result, records = run_records(server, poisson_1k, LLAMA, replicas=2)
    assert result.completed == len(poisson_1k)
    assert max(r.tokens_per_iteration for r in records) <= 512
    computed = sum(r.tokens_per_iteration * r.iterations for r in records)
    # Prompt tokens plus one per output token except the last (never fed back).
    assert computed == poisson_1k.input_tokens.sum() + (poisson_1k.output_tokens - 1).sum()
    assert sum(r.emitted_tokens for r in records) == poisson_1k.output_tokens.sum()
    assert np.all(result.ttft_ms >= LLAMA.alpha_ms)
    assert np.all(result.e2e_ms >= result.ttft_ms)


def test_advance_moves_the_clock_like_run_without_building_a_result() -> None:
    trace = poisson_trace(4.0, 30.0, LengthDist(LengthKind.UNIFORM, 256),
                          LengthDist(LengthKind.UNIFORM, 64), np.random.default_rng(2))
    ran, advanced = (Simulator(LLAMA, ServerConfig(), replicas=2) for _ in range(2))
    for sim in (ran, advanced):
        sim.add_requests(trace)
    for until_s in (5.0, 12.5, 40.0):
        expected = ran.run(until_s)
        advanced.advance(until_s)
        assert advanced.now_s == until_s == ran.now_s
        got = advanced.result()
        assert got.completed == expected.completed
        np.testing.assert_array_equal(got.finish_s, expected.finish_s)
    assert ran.result().completed > 50  # the runs did serve requests
