"""The compiled event loop (model/simulation/compiled_fleet.py) gives `Simulator`'s events and
results exactly (issue 45), against the numpy replica step in the Python event loop: every
request's times, every iteration record, the fleet's status at each read, on fleets that
preempt, admit in chunks, cut decode runs, scale up, cancel startups and drain, with and
without a KV limit, prefix-cached prompts, a waiting-room limit and both routers."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from model.simulation.bucket_kernel import bucket_add
from model.simulation.compiled_fleet import CompiledFleet
from model.simulation.records import WindowRecords
from model.simulation.replica import IterationRecord
from model.simulation.simulator import ReplicaStatus, Router, SimResult, Simulator
from tests.model.simulation.test_step_kernel import CASES, PARAMS, _trace

# (time s, replicas asked for): scale up, cancel two still starting, drain, up again.
SCALING = {20: 4, 25: 2, 60: 1, 150: 3, 200: 2}


def _run(compiled: bool, seed: int, cached: bool, case: dict[str, Any], *, chunks: bool,
         replicas: int = 2
         ) -> tuple[SimResult, list[IterationRecord], list[list[ReplicaStatus]], float]:
    kw: dict[str, Any] = dict(replicas=replicas, router=case.get("router", Router.ROUND_ROBIN),
                              kv_capacity_tokens=case["kv_capacity_tokens"],
                              startup_delay_s=10.0, max_jump_s=1.0)
    sim: Simulator | CompiledFleet
    if compiled:
        sim = CompiledFleet(PARAMS, case["server"], **kw)
    else:
        sim = Simulator(PARAMS, case["server"], record_iterations=True, compiled_step=False,
                        **kw)
    trace = _trace(seed, cached, case.get("max_prompt", 6000))
    if not chunks:
        sim.add_requests(trace)
    records: list[IterationRecord] = []
    statuses: list[list[ReplicaStatus]] = []
    peek = 0.0
    for second in range(1, 400):
        if chunks:  # offered second by second, as the replay engine offers a window's
            rows = (trace.arrival_s > second - 1) & (trace.arrival_s <= second)
            sim.add_requests(type(trace)(trace.arrival_s[rows], trace.input_tokens[rows],
                                         trace.output_tokens[rows],
                                         None if trace.cached_tokens is None
                                         else trace.cached_tokens[rows]))
        if isinstance(sim, CompiledFleet):
            statuses.extend(sim.advance_sampled([second - 0.5, float(second)]))
        else:
            sim.advance(second - 0.5)
            statuses.append(sim.replica_status())
            sim.advance(float(second))
            statuses.append(sim.replica_status())
        if second in SCALING:
            sim.set_replicas(SCALING[second])
        records.extend(sim.drain_records())
        if second == 399:
            peek = sim.peek()
    sim.advance(float("inf"))
    records.extend(sim.drain_records())
    return sim.result(), records, statuses, peek


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("seed,cached,chunks", [(1, False, True), (2, True, False)])
def test_compiled_loop_equals_the_python_loop(name: str, seed: int, cached: bool,
                                              chunks: bool) -> None:
    case = CASES[name]
    want, want_records, want_status, want_peek = _run(False, seed, cached, case, chunks=chunks)
    got, got_records, got_status, got_peek = _run(True, seed, cached, case, chunks=chunks)
    assert want.completed == got.completed > 400
    assert (want.end_s, want.iterations, want.preemptions, want.rejected) == (
        got.end_s, got.iterations, got.preemptions, got.rejected)
    for field in ("first_token_s", "finish_s", "queue_ms", "ttft_ms", "e2e_ms", "replica",
                  "request_preemptions"):
        assert np.array_equal(getattr(want, field), getattr(got, field), equal_nan=True), field
    assert want_status == got_status
    assert (want_peek == np.inf) == (got_peek == np.inf)
    assert len(want_records) == len(got_records)
    for a, b in zip(want_records, got_records, strict=True):
        assert (a.replica, a.end_s, a.iterations, a.tokens_per_iteration, a.emitted_tokens,
                a.preemptions) == (b.replica, b.end_s, b.iterations, b.tokens_per_iteration,
                                   b.emitted_tokens, b.preemptions)
        for field in ("gap_s", "gap_weight", "first_token_ids", "finished_ids"):
            assert np.array_equal(getattr(a, field), getattr(b, field)), field


def test_a_fleet_started_larger_than_its_first_arrays_equals_the_python_loop() -> None:
    """The replica arrays start with room for 8; a fleet started at 12 (the replay's fixed
    fleets at `replicas.max`) grows them while it is built, and runs as `Simulator` does."""
    case = CASES["kv-limit-preempting"]
    want, want_records, want_status, _ = _run(False, 3, False, case, chunks=True, replicas=12)
    got, got_records, got_status, _ = _run(True, 3, False, case, chunks=True, replicas=12)
    assert len(got_status[0]) == 12
    assert want_status == got_status and len(want_records) == len(got_records)
    assert np.array_equal(want.finish_s, got.finish_s, equal_nan=True)


def test_the_runs_cover_the_loops_harder_paths() -> None:
    """Cancelled startups, drains, cut decode runs and refusals happen in the runs above."""
    result, records, statuses, _ = _run(True, 1, False, CASES["kv-limit-preempting"],
                                        chunks=True)
    states = {s.state.value for status in statuses for s in status}
    assert states == {"starting", "ready", "draining", "removed"}
    assert result.preemptions > 100 and any(r.iterations > 1 for r in records)
    limited, *_ = _run(True, 1, False, CASES["queue-limit-least-loaded"], chunks=False)
    assert limited.rejected > 0


def test_columns_read_back_as_the_records() -> None:
    _, records, _, _ = _run(False, 1, True, CASES["kv-tight"], chunks=True)
    columns = WindowRecords.of(records)
    assert len(columns) == len(records)
    for a, b in zip(records[:300], columns, strict=False):
        assert (a.replica, a.end_s, a.iterations) == (b.replica, b.end_s, b.iterations)
        assert np.array_equal(a.gap_s, b.gap_s) and np.array_equal(a.finished_ids,
                                                                   b.finished_ids)
    one = columns.select(columns.replica == 1)
    assert [r.end_s for r in one] == [r.end_s for r in records if r.replica == 1]
    assert np.array_equal(one.gap_s, np.concatenate([r.gap_s for r in records
                                                     if r.replica == 1]))


def test_bucket_add_counts_as_searchsorted_and_bincount() -> None:
    bounds = np.array([0.01, 0.025, 0.05, 0.1, 1.0])
    values = np.array([0.0, 0.01, 0.0100001, 0.05, 0.3, 1.0, 2.0, np.inf, -np.inf, np.nan,
                       0.025, 0.07])
    weights = np.arange(1.0, values.size + 1)
    for w in (weights, None):
        want = np.full(bounds.size + 1, 3.0) + np.bincount(
            np.searchsorted(bounds, values, side="left"), weights=w, minlength=bounds.size + 1)
        got = np.full(bounds.size + 1, 3.0)
        bucket_add(bounds, values, np.empty(0) if w is None else w, got)
        assert np.array_equal(want, got)
