"""The replica's engine step compiled (model/queueing/kernel/jit.py): scheduling an iteration
(budget hand-out, KV preemption, FCFS admission) and applying it (tokens, first tokens, gaps,
finished requests), each in one call over the slot arrays, the waiting queue's buffer and the
request table's columns. The arithmetic is `Replica`'s numpy code (model/simulation/replica.py)
operation for operation, on the same integer and float64 values (no fast-math, no
reassociation): the same iterations, times and records.

Slot arrays are the rows of one int64 table `slots` (request, tokens pending, KV context,
tokens emitted, output length, tokens allotted this iteration) and the float64 `last_emit_s`:
one argument each crosses the call instead of six.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from model.queueing.kernel.jit import compiled

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]

REQ, PENDING, CONTEXT, EMITTED, N_OUT, ALLOC = range(6)
SLOT_ROWS = 6
# `plan`'s outcome.
IDLE, ITERATION, JUMP = 0, 1, 2


@compiled
def plan(
    slots: IntArray,
    last_emit_s: FloatArray,
    running: int,
    budget: int,
    kv_cap: int,
    max_seqs: int,
    queue: IntArray,
    head: int,
    tail: int,
    now_s: float,
    req_cached: IntArray,
    req_input: IntArray,
    req_output: IntArray,
    req_emitted: IntArray,
    req_last_emit_s: FloatArray,
    req_preemptions: IntArray,
    req_first_sched_s: FloatArray,
) -> tuple[int, int, int, int, int, int]:
    """Schedule the next iteration: (outcome, running, queue head, preempted, tokens, KV
    read). kv_cap < 0: no KV limit. For JUMP, tokens is the run's length k and KV read the
    context held; for ITERATION, the tokens computed and the KV the iteration reads. The queue
    needs `running` free places before `head` (preempted requests go back to its front)."""
    r = running
    used = 0
    preempted = 0
    if r:
        total = 0
        for i in range(r):
            total += slots[PENDING, i]
        if total <= budget:
            for i in range(r):
                slots[ALLOC, i] = slots[PENDING, i]
            used = total
        else:
            before = 0
            for i in range(r):
                pend = slots[PENDING, i]
                slots[ALLOC, i] = min(max(budget - before, 0), pend)
                before += pend
            used = budget
        if kv_cap >= 0:
            need = 0
            keep = 0
            for i in range(r):
                need += slots[CONTEXT, i] + slots[ALLOC, i]
                if need <= kv_cap:
                    keep = i + 1
            if need > kv_cap:
                keep = max(1, keep)
                preempted = r - keep
                # The newest slots back to the front of the queue, the oldest of them first.
                head -= preempted
                for j in range(preempted):
                    i = keep + j
                    rid = slots[REQ, i]
                    req_emitted[rid] = slots[EMITTED, i]
                    req_last_emit_s[rid] = last_emit_s[i]
                    req_preemptions[rid] += 1
                    queue[head + j] = rid
                r = keep
                used = 0
                for i in range(r):
                    used += slots[ALLOC, i]
        batch_fixed = r == max_seqs or head == tail
        if preempted == 0 and total == r and r <= budget and batch_fixed:
            least = slots[EMITTED, 0]
            for i in range(1, r):
                least = min(least, slots[EMITTED, i])
            if least:
                k = slots[N_OUT, 0] - slots[EMITTED, 0]
                context = 0
                for i in range(r):
                    k = min(k, slots[N_OUT, i] - slots[EMITTED, i])
                    context += slots[CONTEXT, i]
                if kv_cap >= 0:
                    k = min(k, max(1, (kv_cap - context) // r))
                return JUMP, r, head, 0, k, context
    if preempted == 0 and r < max_seqs and used < budget and head < tail:
        r, head = _admit(slots, last_emit_s, r, budget - used, kv_cap, max_seqs, queue, head,
                         tail, now_s, req_cached, req_input, req_output, req_emitted,
                         req_last_emit_s, req_first_sched_s)
    if r == 0:
        return IDLE, 0, head, preempted, 0, 0
    tokens = 0
    ctx = 0
    for i in range(r):
        a = slots[ALLOC, i]
        tokens += a
        if a > 0:
            ctx += slots[CONTEXT, i]
    return ITERATION, r, head, preempted, tokens, ctx + tokens


@compiled
def _admit(
    slots: IntArray,
    last_emit_s: FloatArray,
    r: int,
    budget_left: int,
    kv_cap: int,
    max_seqs: int,
    queue: IntArray,
    head: int,
    tail: int,
    now_s: float,
    req_cached: IntArray,
    req_input: IntArray,
    req_output: IntArray,
    req_emitted: IntArray,
    req_last_emit_s: FloatArray,
    req_first_sched_s: FloatArray,
) -> tuple[int, int]:
    """Admit waiting requests FCFS into slots r.. with the budget left: (running, head)."""
    k_max = min(max_seqs - r, tail - head, budget_left)
    kv_free = 0
    if kv_cap >= 0:
        kv_free = kv_cap
        for i in range(r):
            kv_free -= slots[CONTEXT, i] + slots[ALLOC, i]
    prev = 0  # prompt tokens of the requests before this one
    held = 0
    n = 0
    for j in range(k_max):
        rid = queue[head + j]
        cached = req_cached[rid]
        # A cached prefix is held but not computed; a preempted request recomputes its output.
        prompt = req_input[rid] - cached + req_emitted[rid]
        if prev >= budget_left:
            break
        alloc = min(prompt, budget_left - prev)
        if kv_cap >= 0:
            held += alloc + cached
            if held > kv_free:
                break
        i = r + n
        slots[REQ, i] = rid
        slots[PENDING, i] = prompt
        slots[CONTEXT, i] = cached
        slots[EMITTED, i] = req_emitted[rid]
        slots[N_OUT, i] = req_output[rid]
        slots[ALLOC, i] = alloc
        last_emit_s[i] = req_last_emit_s[rid]
        if np.isnan(req_first_sched_s[rid]):
            req_first_sched_s[rid] = now_s
        prev += prompt
        n += 1
    return r + n, head + n


@compiled
def apply_iteration(
    slots: IntArray,
    last_emit_s: FloatArray,
    running: int,
    now_s: float,
    req_first_token_s: FloatArray,
    req_finish_s: FloatArray,
) -> tuple[int, int, int, FloatArray, IntArray, IntArray, IntArray]:
    """Apply an iteration of the planned allotments ending at now_s: (running left, tokens
    emitted, tokens computed, inter-token gaps of tokens after a request's first, their
    weights (1 each), first-token requests, finished requests); finished slots are compacted
    away in order."""
    r = running
    gaps = np.empty(r)
    firsts = np.empty(r, dtype=np.int64)
    done = np.empty(r, dtype=np.int64)
    n_gaps = n_first = n_done = 0
    emitted_now = 0
    tokens = 0
    out = 0
    for i in range(r):
        alloc = slots[ALLOC, i]
        tokens += alloc
        slots[PENDING, i] -= alloc
        slots[CONTEXT, i] += alloc
        finished = False
        if slots[PENDING, i] == 0:
            emitted_now += 1
            rid = slots[REQ, i]
            if slots[EMITTED, i] == 0:
                firsts[n_first] = rid
                n_first += 1
                req_first_token_s[rid] = now_s
            else:
                gaps[n_gaps] = now_s - last_emit_s[i]
                n_gaps += 1
            slots[EMITTED, i] += 1
            last_emit_s[i] = now_s
            if slots[EMITTED, i] >= slots[N_OUT, i]:
                finished = True
                done[n_done] = rid
                n_done += 1
                req_finish_s[rid] = now_s
            else:
                slots[PENDING, i] = 1
        if not finished:
            if out != i:
                for row in range(SLOT_ROWS):
                    slots[row, out] = slots[row, i]
                last_emit_s[out] = last_emit_s[i]
            out += 1
    return (out, emitted_now, tokens, gaps[:n_gaps].copy(), np.ones(n_gaps, dtype=np.int64),
            firsts[:n_first].copy(), done[:n_done].copy())


@compiled
def apply_jump(
    slots: IntArray,
    last_emit_s: FloatArray,
    running: int,
    k: int,
    now_s: float,
    first_end_s: float,
    t0_ms: float,
    dt_ms: float,
    record: bool,
    req_finish_s: FloatArray,
) -> tuple[int, FloatArray, IntArray, IntArray]:
    """Apply a run of k one-token decode iterations ending at now_s: (running left, gaps,
    their weights, finished requests). The gaps (when recording) are each slot's first gap
    (weight 1), then the run's k - 1 later gaps (weight: the batch)."""
    r = running
    gaps = np.empty(r + k - 1 if record else 0)
    weights = np.ones(gaps.size, dtype=np.int64)
    done = np.empty(r, dtype=np.int64)
    n_done = 0
    out = 0
    if record:
        for i in range(r):
            gaps[i] = first_end_s - last_emit_s[i]
        for j in range(1, k):
            gaps[r + j - 1] = (t0_ms + dt_ms * j) / 1000.0
            weights[r + j - 1] = r
    for i in range(r):
        slots[CONTEXT, i] += k
        slots[EMITTED, i] += k
        last_emit_s[i] = now_s
        if slots[EMITTED, i] >= slots[N_OUT, i]:
            rid = slots[REQ, i]
            done[n_done] = rid
            n_done += 1
            req_finish_s[rid] = now_s
        else:
            if out != i:
                for row in range(SLOT_ROWS):
                    slots[row, out] = slots[row, i]
                last_emit_s[out] = last_emit_s[i]
            out += 1
    return out, gaps, weights, done[:n_done].copy()
