"""The compiled replica step (model/simulation/step_kernel.py) gives the numpy step's events and
results exactly (issue 45): every request's times, every iteration record, on fleets that
preempt, admit in chunks, cut decode runs, scale up and drain, with and without a KV limit,
prefix-cached prompts and a waiting-room limit."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from model.queueing.params import ServerConfig, ServiceParams
from model.simulation.replica import IterationRecord
from model.simulation.simulator import Router, SimResult, Simulator
from model.simulation.workloads import RequestTrace

PARAMS = ServiceParams(6.68, 0.0201, 5.52e-5)
CASES: dict[str, dict[str, Any]] = {
    "kv-limit-preempting": dict(server=ServerConfig(max_batch_size=64,
                                                    max_num_batched_tokens=2048),
                                kv_capacity_tokens=60_000),
    # Short prompts, long outputs: decoding outgrows the KV by more than the newest slot holds.
    "kv-tight": dict(server=ServerConfig(max_batch_size=64, max_num_batched_tokens=8192),
                     kv_capacity_tokens=4_000, max_prompt=60),
    "no-kv-limit": dict(server=ServerConfig(max_batch_size=16, max_num_batched_tokens=512),
                        kv_capacity_tokens=None),
    "queue-limit-least-loaded": dict(server=ServerConfig(max_batch_size=8,
                                                         max_num_batched_tokens=8192,
                                                         max_queue_size=20),
                                     kv_capacity_tokens=200_000, router=Router.LEAST_LOADED),
}


def _trace(seed: int, cached: bool, max_prompt: int) -> RequestTrace:
    rng = np.random.default_rng(seed)
    n = 1500
    arrival = np.sort(rng.uniform(0, 120, n))
    prompts = rng.integers(1, max_prompt, n)
    cached_tokens = rng.integers(0, prompts) if cached else None
    return RequestTrace(arrival, prompts, rng.integers(1, 700, n), cached_tokens=cached_tokens)


def _run(compiled: bool, seed: int, cached: bool, case: dict[str, Any]
         ) -> tuple[SimResult, list[IterationRecord]]:
    sim = Simulator(PARAMS, case["server"], replicas=2, router=case.get("router",
                                                                        Router.ROUND_ROBIN),
                    kv_capacity_tokens=case["kv_capacity_tokens"], startup_delay_s=10.0,
                    max_jump_s=1.0, record_iterations=True, compiled_step=compiled)
    sim.add_requests(_trace(seed, cached, case.get("max_prompt", 6000)))
    records: list[IterationRecord] = []
    for second in range(1, 400):
        sim.advance(float(second))
        if second == 20:
            sim.set_replicas(4)
        if second == 60:
            sim.set_replicas(1)  # three drain
        records.extend(sim.drain_records())
    return sim.run(), records


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("seed,cached", [(1, False), (2, True)])
def test_compiled_step_equals_the_numpy_step(name: str, seed: int, cached: bool) -> None:
    case = CASES[name]
    want, want_records = _run(False, seed, cached, case)
    got, got_records = _run(True, seed, cached, case)
    assert want.completed == got.completed > 500
    assert (want.iterations, want.preemptions, want.rejected) == (
        got.iterations, got.preemptions, got.rejected)
    for field in ("first_token_s", "finish_s", "queue_ms", "ttft_ms", "e2e_ms", "replica",
                  "request_preemptions"):
        assert np.array_equal(getattr(want, field), getattr(got, field), equal_nan=True), field
    assert len(want_records) == len(got_records)
    for a, b in zip(want_records, got_records, strict=True):
        assert (a.replica, a.end_s, a.iterations, a.tokens_per_iteration, a.emitted_tokens,
                a.preemptions) == (b.replica, b.end_s, b.iterations, b.tokens_per_iteration,
                                   b.emitted_tokens, b.preemptions)
        for field in ("gap_s", "gap_weight", "first_token_ids", "finished_ids"):
            assert np.array_equal(getattr(a, field), getattr(b, field)), field


def test_the_cases_preempt_and_cut_runs() -> None:
    """The comparison above covers the step's harder paths."""
    result, records = _run(True, 1, False, CASES["kv-limit-preempting"])
    assert result.preemptions > 100
    _, tight = _run(True, 2, True, CASES["kv-tight"])
    assert max(r.preemptions for r in tight) > 1  # several slots preempted at once
    assert any(r.iterations > 1 for r in records)  # decode runs
    assert any(r.first_token_ids.size and r.gap_s.size for r in records)  # mixed iterations
    limited, _ = _run(True, 1, False, CASES["queue-limit-least-loaded"])
    assert limited.rejected > 0
