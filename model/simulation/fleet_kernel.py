"""The simulator's event loop compiled (issue 45): a fleet's arrivals, replica startups and
iteration ends between two times in one call, over arrays (model/simulation/compiled_fleet.py
holds them between calls). It takes the events in `Simulator`'s order (time, then replica
ready < arrival < iteration end, then the order they were scheduled in) and applies each as
`Simulator`'s handlers and `Replica`'s compiled step do (model/simulation/step_kernel.py, called
from here), on the same integer and float64 values: the same events, times and records.

The heap of `Simulator` holds one live event per replica at most (an iteration end or a kick),
the replica's startup and the next arrival: here each is a field of its replica or the next
row of the request table, and the next event is the least of them. An iteration end superseded
by a cut decode run is only remembered by its time (`STALE_S`): it changes nothing when popped
but keeps the fleet from being idle (`peek`) until then, as in the heap.

State: per replica (by index) the int fields `ri[index, ...]` and float fields `rf[index, ...]`
named below; per lane (a replica not removed holds one; compiled_fleet.py reuses them) its
slot table `slots[lane]`, `last_emit[lane]` and waiting queue `queues[lane]` (head and tail in
`ri`); the fleet's counters `fl`; arrivals waiting for a ready replica in `pending`.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from model.queueing.kernel.jit import compiled
from model.simulation.step_kernel import (
    CONTEXT,
    IDLE,
    JUMP,
    apply_iteration,
    apply_jump,
    plan,
)

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]

# ri columns.
STATE, BUSY, KICK, RUNNING, ITERS, PREEMPTS, K, IS_JUMP, ITER_PREEMPTED, EV_LIVE, EV_SEQ, \
    READY_PENDING, Q_HEAD, Q_TAIL, LANE = range(15)
INT_FIELDS = 15
# rf columns: iteration start, first duration and increase (ms), live event, startup, stale.
START_S, T0_MS, DT_MS, EV_S, READY_S, STALE_S = range(6)
FLOAT_FIELDS = 6
# Replica states (ReplicaState's order).
STARTING, READY, DRAINING, REMOVED = range(4)
# fl: replicas created, next request row to arrive, round-robin counter, event sequence,
# pending queue head and tail.
N_REPLICAS, NEXT_ARRIVAL, RR, SEQ, P_HEAD, P_TAIL = range(6)
FLEET_FIELDS = 6
# cfg (float64): alpha, beta, gamma (ms), decode-run cap (ms). icfg (int64): token budget, KV
# capacity (-1: none), max batch, waiting-room limit (-1: none), router (0 round-robin).
ALPHA, BETA, GAMMA, MAX_JUMP_MS = range(4)
BUDGET, KV_CAP, MAX_SEQS, MAX_QUEUE, ROUTER = range(5)
LEAST_LOADED = 1
# Status columns of a sample, per replica.
S_STATE, S_RUNNING, S_WAITING, S_KV, S_ITERS, S_PREEMPTS = range(6)
SAMPLE_FIELDS = 6
# Record columns (int): replica, iterations, tokens per iteration, tokens emitted, preemptions,
# and how many gaps, first tokens and finished requests follow in the flat arrays.
R_REPLICA, R_ITERS, R_TOKENS, R_EMITTED, R_PREEMPTS, R_GAPS, R_FIRSTS, R_DONE = range(8)
RECORD_FIELDS = 8
# `run`'s outcome: every sample time reached, or stopped before the row `arrival_limit`.
DONE, MORE_ARRIVALS = 0, 1
_KIND_NONE, _KIND_READY, _KIND_ARRIVAL, _KIND_ITERATION = -1, 0, 1, 2


@compiled
def _total_ms(k: int, t0: float, dt: float) -> float:
    return k * t0 + dt * k * (k - 1) / 2.0


@compiled
def _within(elapsed_ms: float, t0: float, dt: float, at_least: bool) -> int:
    """`Replica._iterations_within`."""
    a, b = dt / 2.0, t0 - dt / 2.0
    root = elapsed_ms / b if a <= 0 else (-b + math.sqrt(b * b + 4 * a * elapsed_ms)) / (2 * a)
    k = max(1, int(math.floor(root)) - 1)
    if at_least:
        while _total_ms(k, t0, dt) < elapsed_ms:
            k += 1
        return k
    while _total_ms(k + 1, t0, dt) <= elapsed_ms:
        k += 1
    return k


@compiled
def _before(t: float, p: int, s: int, best_t: float, best_p: int, best_s: int) -> bool:
    return t < best_t or (t == best_t and (p < best_p or (p == best_p and s < best_s)))


@compiled
def _end_s(rf: FloatArray, ri: IntArray, i: int) -> float:
    return float(rf[i, START_S] + _total_ms(ri[i, K], rf[i, T0_MS], rf[i, DT_MS]) / 1000.0)


@compiled
def _schedule(ri: IntArray, rf: FloatArray, fl: IntArray, i: int, time_s: float) -> None:
    """The replica's iteration-end event at time_s (a live one left is superseded)."""
    if ri[i, EV_LIVE]:
        rf[i, STALE_S] = max(rf[i, STALE_S], rf[i, EV_S])
    ri[i, EV_LIVE] = 1
    rf[i, EV_S] = time_s
    ri[i, EV_SEQ] = fl[SEQ]
    fl[SEQ] += 1


@compiled
def _recentre(ri: IntArray, queues: IntArray, i: int, front: int) -> None:
    """Move replica i's waiting queue to start at `front` in its lane's buffer."""
    lane = ri[i, LANE]
    head, tail = ri[i, Q_HEAD], ri[i, Q_TAIL]
    n = tail - head
    if head == front:
        return
    if front < head:
        for j in range(n):
            queues[lane, front + j] = queues[lane, head + j]
    else:
        for j in range(n - 1, -1, -1):
            queues[lane, front + j] = queues[lane, head + j]
    ri[i, Q_HEAD], ri[i, Q_TAIL] = front, front + n


@compiled
def _enqueue(
    ri: IntArray, rf: FloatArray, fl: IntArray, queues: IntArray, icfg: IntArray, i: int,
    req: int, now_s: float, t_replica: IntArray, t_rejected: BoolArray,
) -> None:
    """`Simulator._enqueue`: into replica i's queue (or refused), kicking or cutting it."""
    t_replica[req] = i
    limit = icfg[MAX_QUEUE]
    if limit >= 0 and ri[i, Q_TAIL] - ri[i, Q_HEAD] >= limit:
        t_rejected[req] = True
        return
    if ri[i, Q_TAIL] >= queues.shape[1]:
        _recentre(ri, queues, i, icfg[MAX_SEQS])
    queues[ri[i, LANE], ri[i, Q_TAIL]] = req
    ri[i, Q_TAIL] += 1
    if ri[i, BUSY]:
        # Replica.truncate_jump: a decode run cut at the end of the iteration in progress.
        if ri[i, IS_JUMP] and ri[i, K] > 1:
            k = _within((now_s - rf[i, START_S]) * 1000.0, rf[i, T0_MS], rf[i, DT_MS], True)
            if k < ri[i, K]:
                ri[i, K] = k
                _schedule(ri, rf, fl, i, max(_end_s(rf, ri, i), now_s))
    elif not ri[i, KICK]:
        ri[i, KICK] = 1
        _schedule(ri, rf, fl, i, now_s)


@compiled
def _dispatch(
    ri: IntArray, rf: FloatArray, fl: IntArray, queues: IntArray, icfg: IntArray,
    ready: IntArray, n_ready: int, req: int, now_s: float, t_replica: IntArray,
    t_rejected: BoolArray,
) -> None:
    """`Simulator._dispatch` among the ready replicas (by index)."""
    if icfg[ROUTER] == LEAST_LOADED:
        best = ready[0]
        best_load = ri[best, RUNNING] + ri[best, Q_TAIL] - ri[best, Q_HEAD]
        for j in range(1, n_ready):
            i = ready[j]
            load = ri[i, RUNNING] + ri[i, Q_TAIL] - ri[i, Q_HEAD]
            if load < best_load:
                best, best_load = i, load
    else:
        best = ready[fl[RR] % n_ready]
        fl[RR] += 1
    _enqueue(ri, rf, fl, queues, icfg, best, req, now_s, t_replica, t_rejected)


@compiled
def _ready_list(ri: IntArray, live: IntArray, ready: IntArray) -> int:
    n = 0
    for i in live:
        if ri[i, STATE] == READY:
            ready[n] = i
            n += 1
    return n


@compiled
def _grow_rows(a: IntArray, need: int) -> IntArray:
    if need <= a.shape[0]:
        return a
    out = np.zeros((max(need, 2 * a.shape[0]), a.shape[1]), dtype=np.int64)
    out[: a.shape[0]] = a
    return out


@compiled
def _grow_f(a: FloatArray, need: int) -> FloatArray:
    if need <= a.size:
        return a
    out = np.empty(max(need, 2 * a.size))
    out[: a.size] = a
    return out


@compiled
def _grow_i(a: IntArray, need: int) -> IntArray:
    if need <= a.size:
        return a
    out = np.empty(max(need, 2 * a.size), dtype=np.int64)
    out[: a.size] = a
    return out


@compiled
def run(
    ri: IntArray, rf: FloatArray, fl: IntArray, live: IntArray, slots: IntArray,
    last_emit: FloatArray, queues: IntArray, pending: IntArray, cfg: FloatArray,
    icfg: IntArray, t_arrival: FloatArray, t_input: IntArray, t_output: IntArray,
    t_cached: IntArray, t_replica: IntArray, t_rejected: BoolArray, t_first_sched: FloatArray,
    t_first_token: FloatArray, t_finish: FloatArray, t_preemptions: IntArray,
    t_emitted: IntArray, t_last_emit: FloatArray, n_rows: int, arrival_limit: int,
    now_s: float, times: FloatArray, first_time: int, samples: IntArray,
) -> tuple[int, int, float, IntArray, FloatArray, FloatArray, IntArray, IntArray, IntArray,
           IntArray]:
    """Every event at or before each of `times` from `first_time` on, the fleet's status
    written to `samples[j]` once time j is reached. Stops early (MORE_ARRIVALS) before the
    arrival of row `arrival_limit` (the caller makes room in the queues and calls again from
    the time returned). Returns (outcome, next time index, now, records, their end times,
    gaps, gap weights, first-token requests, finished requests, counts: records, gaps, first
    tokens, finished)."""
    alpha, beta, gamma, max_jump_ms = cfg[ALPHA], cfg[BETA], cfg[GAMMA], cfg[MAX_JUMP_MS]
    budget, kv_cap, max_seqs = icfg[BUDGET], icfg[KV_CAP], icfg[MAX_SEQS]
    recs = np.zeros((256, RECORD_FIELDS), dtype=np.int64)
    rec_end = np.empty(256)
    gaps = np.empty(1024)
    weights = np.empty(1024, dtype=np.int64)
    firsts = np.empty(256, dtype=np.int64)
    done = np.empty(256, dtype=np.int64)
    n_rec = n_gap = n_first = n_done = 0
    ready = np.empty(live.size, dtype=np.int64)
    j = first_time
    outcome = DONE
    while j < times.size:
        until_s = times[j]
        # The least event by (time, priority, sequence), as the heap pops them.
        kind, who = _KIND_NONE, -1
        best_t, best_p, best_s = math.inf, 3, 0
        for i in live:
            if ri[i, READY_PENDING] and _before(rf[i, READY_S], 0, i, best_t, best_p, best_s):
                kind, who, best_t, best_p, best_s = _KIND_READY, i, rf[i, READY_S], 0, i
        row = fl[NEXT_ARRIVAL]
        if row < n_rows and _before(t_arrival[row], 1, 0, best_t, best_p, best_s):
            kind, who, best_t, best_p, best_s = _KIND_ARRIVAL, row, t_arrival[row], 1, 0
        for i in live:
            if ri[i, EV_LIVE] and _before(rf[i, EV_S], 2, ri[i, EV_SEQ], best_t, best_p,
                                          best_s):
                kind, who, best_t, best_p, best_s = (_KIND_ITERATION, i, rf[i, EV_S], 2,
                                                     ri[i, EV_SEQ])
        if best_t > until_s:
            kind = _KIND_NONE
        if kind == _KIND_NONE:
            if math.isfinite(until_s):
                now_s = max(now_s, until_s)
            sample(ri, slots, samples[j])
            j += 1
            continue
        if kind == _KIND_ARRIVAL and who >= arrival_limit:
            outcome = MORE_ARRIVALS
            break
        now_s = best_t
        if kind == _KIND_READY:
            i = who
            ri[i, READY_PENDING] = 0
            if ri[i, STATE] != STARTING:
                continue  # cancelled while starting
            ri[i, STATE] = READY
            n_ready = _ready_list(ri, live, ready)
            for p in range(fl[P_HEAD], fl[P_TAIL]):
                _dispatch(ri, rf, fl, queues, icfg, ready, n_ready, pending[p], now_s,
                          t_replica, t_rejected)
            fl[P_HEAD] = fl[P_TAIL]
        elif kind == _KIND_ARRIVAL:
            req = who
            fl[NEXT_ARRIVAL] += 1
            if kv_cap >= 0 and t_input[req] + t_output[req] > kv_cap:
                t_rejected[req] = True
                continue
            n_ready = _ready_list(ri, live, ready)
            if n_ready == 0:
                pending[fl[P_TAIL]] = req
                fl[P_TAIL] += 1
                continue
            _dispatch(ri, rf, fl, queues, icfg, ready, n_ready, req, now_s, t_replica,
                      t_rejected)
        else:
            i = who
            ri[i, EV_LIVE] = 0
            if ri[i, STATE] == REMOVED:
                continue
            ri[i, KICK] = 0
            lane = ri[i, LANE]
            if ri[i, BUSY]:
                # Replica.finish_iteration and its record.
                ri[i, BUSY] = 0
                r, k = ri[i, RUNNING], ri[i, K]
                ri[i, ITERS] += k
                if ri[i, IS_JUMP]:
                    first_end_s = rf[i, START_S] + rf[i, T0_MS] / 1000.0
                    left, g, w, fin = apply_jump(slots[lane], last_emit[lane], r, k, now_s,
                                                 first_end_s, rf[i, T0_MS], rf[i, DT_MS], True,
                                                 t_finish)
                    emitted, tokens = k * r, r
                    fst = np.empty(0, dtype=np.int64)
                else:
                    left, emitted, tokens, g, w, fst, fin = apply_iteration(
                        slots[lane], last_emit[lane], r, now_s, t_first_token, t_finish)
                ri[i, RUNNING] = left
                recs = _grow_rows(recs, n_rec + 1)
                rec_end = _grow_f(rec_end, n_rec + 1)
                recs[n_rec, R_REPLICA] = i
                recs[n_rec, R_ITERS] = k
                recs[n_rec, R_TOKENS] = tokens
                recs[n_rec, R_EMITTED] = emitted
                recs[n_rec, R_PREEMPTS] = ri[i, ITER_PREEMPTED]
                recs[n_rec, R_GAPS] = g.size
                recs[n_rec, R_FIRSTS] = fst.size
                recs[n_rec, R_DONE] = fin.size
                rec_end[n_rec] = now_s
                n_rec += 1
                gaps = _grow_f(gaps, n_gap + g.size)
                weights = _grow_i(weights, n_gap + g.size)
                gaps[n_gap : n_gap + g.size] = g
                weights[n_gap : n_gap + g.size] = w
                n_gap += g.size
                firsts = _grow_i(firsts, n_first + fst.size)
                firsts[n_first : n_first + fst.size] = fst
                n_first += fst.size
                done = _grow_i(done, n_done + fin.size)
                done[n_done : n_done + fin.size] = fin
                n_done += fin.size
            if ri[i, STATE] == DRAINING and ri[i, RUNNING] + ri[i, Q_TAIL] - ri[i, Q_HEAD] == 0:
                ri[i, STATE] = REMOVED
                continue
            # Replica.start_iteration: the queue needs `running` places before its head.
            if ri[i, Q_HEAD] < ri[i, RUNNING]:
                _recentre(ri, queues, i, max_seqs)
            out, r, head, preempted, tokens, ctx = plan(
                slots[lane], last_emit[lane], ri[i, RUNNING], budget, kv_cap, max_seqs,
                queues[lane], ri[i, Q_HEAD], ri[i, Q_TAIL], now_s, t_cached, t_input, t_output,
                t_emitted, t_last_emit, t_preemptions, t_first_sched)
            ri[i, Q_HEAD] = head
            ri[i, RUNNING] = r
            if out == IDLE:
                ri[i, BUSY] = 0
                continue
            ri[i, BUSY] = 1
            rf[i, START_S] = now_s
            if out == JUMP:
                t0 = alpha + beta * r + gamma * (ctx + r)
                ri[i, K], rf[i, T0_MS], rf[i, DT_MS], ri[i, IS_JUMP] = tokens, t0, gamma * r, 1
                if tokens > 1 and math.isfinite(max_jump_ms):
                    ri[i, K] = min(tokens, max(1, _within(max_jump_ms, t0, gamma * r, False)))
                ri[i, ITER_PREEMPTED] = 0
            else:
                ri[i, K], ri[i, IS_JUMP] = 1, 0
                rf[i, T0_MS], rf[i, DT_MS] = alpha + beta * tokens + gamma * ctx, 0.0
                ri[i, ITER_PREEMPTED] = preempted
                ri[i, PREEMPTS] += preempted
            _schedule(ri, rf, fl, i, max(_end_s(rf, ri, i), now_s))
    counts = np.array([n_rec, n_gap, n_first, n_done], dtype=np.int64)
    return (outcome, j, now_s, recs[:n_rec], rec_end[:n_rec], gaps[:n_gap], weights[:n_gap],
            firsts[:n_first], done[:n_done], counts)


@compiled
def sample(ri: IntArray, slots: IntArray, out: IntArray) -> None:
    """The status of the first `len(out)` replicas (a removed one runs nothing)."""
    for i in range(out.shape[0]):
        out[i, S_STATE] = ri[i, STATE]
        out[i, S_RUNNING] = ri[i, RUNNING]
        out[i, S_WAITING] = ri[i, Q_TAIL] - ri[i, Q_HEAD]
        out[i, S_ITERS] = ri[i, ITERS]
        out[i, S_PREEMPTS] = ri[i, PREEMPTS]
        kv = 0
        lane = ri[i, LANE]
        for s in range(ri[i, RUNNING]):
            kv += slots[lane, CONTEXT, s]
        out[i, S_KV] = kv

