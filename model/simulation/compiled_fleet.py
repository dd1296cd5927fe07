"""A fleet of simulated replicas whose event loop runs compiled (model/simulation/fleet_kernel.py):
`Simulator`'s fleet, events and results (arrivals, routing, startup delay, draining, waiting-room
limit, KV rejections; iterations recorded), advanced from one time to the next in one call
instead of one Python call per event. The replay engine drives its fleets with it (issue 45);
`Simulator` stays the reference it is tested against (tests/model/simulation/
test_compiled_fleet.py).

Between calls the fleet is arrays: per replica its scalars, per lane (a replica not removed
holds one, reused after it is removed) its slots and waiting queue. Before each call the queues
get room for every arrival the call may take (at most `_CHUNK` rows a call: a call stops before
the next row and is called again), so the compiled loop never reallocates them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from model.queueing.params import ServerConfig, ServiceParams
from model.queueing.validation import require_int_at_least, require_non_negative
from model.simulation import fleet_kernel as fk
from model.simulation.records import WindowRecords
from model.simulation.replica import ReplicaState
from model.simulation.request_table import RequestTable
from model.simulation.simulator import (
    ReplicaStatus,
    Router,
    SimResult,
    Simulator,
    check_fleet_arguments,
    table_result,
)
from model.simulation.step_kernel import SLOT_ROWS
from model.simulation.workloads import RequestTrace

_STATES = (ReplicaState.STARTING, ReplicaState.READY, ReplicaState.DRAINING,
           ReplicaState.REMOVED)  # fleet_kernel's codes, in order
_CHUNK = 8192  # arrivals a call may take before its queues are checked for room



class CompiledFleet:
    """`Simulator` with iterations recorded, its event loop compiled; times in s."""

    def __init__(
        self,
        params: ServiceParams,
        server: ServerConfig,
        *,
        replicas: int = 1,
        router: Router = Router.ROUND_ROBIN,
        kv_capacity_tokens: int | None = None,
        startup_delay_s: float = 0.0,
        max_jump_s: float = math.inf,
    ) -> None:
        check_fleet_arguments(replicas, kv_capacity_tokens, max_jump_s)
        self._startup_delay_s = require_non_negative("startup_delay_s", startup_delay_s)
        alpha, beta, gamma = params.as_tuple()
        self._cfg = np.array([alpha, beta, gamma, float(max_jump_s) * 1000.0])
        self._icfg = np.array([
            server.max_num_batched_tokens,
            -1 if kv_capacity_tokens is None else kv_capacity_tokens,
            server.max_batch_size,
            -1 if server.max_queue_size is None else server.max_queue_size,
            fk.LEAST_LOADED if Router(router) is Router.LEAST_LOADED else 0,
        ], dtype=np.int64)  # fmt: skip
        self._b = server.max_batch_size
        self._requests = RequestTable()
        self._ri = np.zeros((8, fk.INT_FIELDS), dtype=np.int64)
        self._rf = np.zeros((8, fk.FLOAT_FIELDS))
        self._fl = np.zeros(fk.FLEET_FIELDS, dtype=np.int64)
        self._slots = np.zeros((0, SLOT_ROWS, self._b), dtype=np.int64)
        self._last_emit = np.zeros((0, self._b))
        self._queues = np.zeros((0, 4 * self._b), dtype=np.int64)
        self._free_lanes: list[int] = []
        self._pending = np.zeros(1024, dtype=np.int64)
        self._now_s = 0.0
        self._records: list[WindowRecords] = []
        for _ in range(replicas):
            i = self._new_replica()  # may grow the arrays: index them after the call
            self._ri[i, fk.STATE] = fk.READY

    @property
    def now_s(self) -> float:
        """Simulated time (s)."""
        return self._now_s

    @property
    def requests(self) -> RequestTable:
        """The live per-request table (read it, never write it)."""
        return self._requests

    @property
    def _n(self) -> int:
        return int(self._fl[fk.N_REPLICAS])

    def add_requests(self, trace: RequestTrace) -> None:
        """Offer more requests; their arrivals must not precede now or earlier offers."""
        self._requests.offer(trace, self._now_s)

    def set_replicas(self, count: int) -> None:
        """Scale to `count` replicas now: add (ready after the startup delay) or drain."""
        count = require_int_at_least("count", count, 0)
        ri = self._ri
        states = ri[: self._n, fk.STATE]
        active = np.flatnonzero((states == fk.STARTING) | (states == fk.READY))
        if count > active.size:
            for _ in range(count - active.size):
                i = self._new_replica()  # may grow the arrays
                self._ri[i, fk.READY_PENDING] = 1
                self._rf[i, fk.READY_S] = self._now_s + self._startup_delay_s
            return
        # Those still starting are cancelled before serving ones drain, newest first; an idle
        # one is removed at once (Simulator._retire).
        order = sorted(active.tolist(), key=lambda i: (bool(states[i] == fk.READY), -i))
        for i in order[: active.size - count]:
            load = ri[i, fk.RUNNING] + ri[i, fk.Q_TAIL] - ri[i, fk.Q_HEAD]
            if ri[i, fk.STATE] == fk.STARTING or load == 0:
                ri[i, fk.STATE] = fk.REMOVED
            else:
                ri[i, fk.STATE] = fk.DRAINING

    def replica_status(self) -> list[ReplicaStatus]:
        """Every replica ever created, by index."""
        out = np.zeros((self._n, fk.SAMPLE_FIELDS), dtype=np.int64)
        fk.sample(self._ri, self._slots, out)
        return _statuses(out)

    def peek(self) -> float:
        """Time (s) of the next event, inf when none is left; an iteration end superseded by
        a cut decode run counts until its time has passed, as in `Simulator`'s heap (then
        the time given may be a later one, never inf)."""
        n, ri, rf = self._n, self._ri, self._rf
        times = [math.inf]
        table = self._requests
        row = int(self._fl[fk.NEXT_ARRIVAL])
        if row < table.size:
            times.append(float(table.arrival_s[row]))
        for field, flag in ((fk.READY_S, fk.READY_PENDING), (fk.EV_S, fk.EV_LIVE)):
            live = ri[:n, flag] != 0
            if live.any():
                times.append(float(rf[:n, field][live].min()))
        stale = rf[:n, fk.STALE_S]
        later = stale > self._now_s
        if later.any():
            times.append(float(stale[later].min()))
        return min(times)

    def advance(self, until_s: float) -> None:
        """Process every event at or before until_s."""
        self.advance_sampled([until_s], keep=False)

    def advance_sampled(
        self, times_s: Sequence[float], *, keep: bool = True
    ) -> list[list[ReplicaStatus]]:
        """Process the events up to each of `times_s` (increasing) in turn; the fleet's status
        at each (`replica_status()` then), when `keep`."""
        times = np.asarray(times_s, dtype=np.float64)
        samples = np.zeros((times.size, self._n, fk.SAMPLE_FIELDS), dtype=np.int64)
        table = self._requests
        j = 0
        while True:
            limit = self._make_room()
            live = np.flatnonzero(
                (self._ri[: self._n, fk.STATE] != fk.REMOVED)
                | (self._ri[: self._n, fk.READY_PENDING] != 0)
                | (self._ri[: self._n, fk.EV_LIVE] != 0))
            outcome, j, now, recs, ends, gaps, weights, firsts, done, _ = fk.run(
                self._ri, self._rf, self._fl, live, self._slots, self._last_emit, self._queues,
                self._pending, self._cfg, self._icfg, table.arrival_s, table.input_tokens,
                table.output_tokens, table.cached_tokens, table.replica, table.rejected,
                table.first_sched_s, table.first_token_s, table.finish_s, table.preemptions,
                table.emitted, table.last_emit_s, table.size, limit, self._now_s, times, j,
                samples)  # fmt: skip
            self._now_s = float(now)
            if recs.shape[0]:
                self._records.append(_records(recs, ends, gaps, weights, firsts, done))
            self._free_removed()
            if outcome == fk.DONE:
                break
        return [_statuses(s) for s in samples] if keep else []

    def drain_records(self) -> WindowRecords:
        """Iteration records since the last call, replica by replica (`Simulator`'s order)."""
        out = WindowRecords.concat(self._records).by_replica()
        self._records = []
        return out

    def result(self) -> SimResult:
        """Records of every request that has arrived so far."""
        n = self._n
        return table_result(self._requests, int(self._fl[fk.NEXT_ARRIVAL]), self._now_s,
                            int(self._ri[:n, fk.ITERS].sum()),
                            int(self._ri[:n, fk.PREEMPTS].sum()))

    # -- arrays -------------------------------------------------------------------------------

    def _new_replica(self) -> int:
        i = self._n
        if i >= self._ri.shape[0]:
            self._ri = np.concatenate((self._ri, np.zeros_like(self._ri)))
            self._rf = np.concatenate((self._rf, np.zeros_like(self._rf)))
        self._ri[i] = 0
        self._rf[i] = 0.0
        self._ri[i, fk.STATE] = fk.STARTING
        self._ri[i, fk.LANE] = self._take_lane()
        self._ri[i, fk.Q_HEAD] = self._ri[i, fk.Q_TAIL] = self._b
        self._fl[fk.N_REPLICAS] += 1
        return i

    def _take_lane(self) -> int:
        if self._free_lanes:
            lane = self._free_lanes.pop()
        else:
            lane = self._slots.shape[0]
            self._slots = np.concatenate(
                (self._slots, np.zeros((max(1, lane), SLOT_ROWS, self._b), dtype=np.int64)))
            self._last_emit = np.concatenate(
                (self._last_emit, np.zeros((max(1, lane), self._b))))
            self._queues = np.concatenate(
                (self._queues, np.zeros((max(1, lane), self._queues.shape[1]), dtype=np.int64)))
            self._free_lanes.extend(range(self._slots.shape[0] - 1, lane, -1))
        self._slots[lane] = 0
        self._last_emit[lane] = 0.0
        return lane

    def _free_removed(self) -> None:
        """Lanes of replicas removed (and idle) go back to the pool."""
        n, ri = self._n, self._ri
        gone = np.flatnonzero((ri[:n, fk.STATE] == fk.REMOVED) & (ri[:n, fk.LANE] >= 0))
        for i in gone.tolist():
            self._free_lanes.append(int(ri[i, fk.LANE]))
            ri[i, fk.LANE] = -1

    def _make_room(self) -> int:
        """Room in every queue for the next `_CHUNK` arrivals and the arrivals held for a
        ready replica; the row the call must stop before."""
        row = int(self._fl[fk.NEXT_ARRIVAL])
        limit = min(self._requests.size, row + _CHUNK)
        incoming = limit - row
        head, tail = int(self._fl[fk.P_HEAD]), int(self._fl[fk.P_TAIL])
        held = tail - head
        if head or tail + incoming > self._pending.size:
            size = max(self._pending.size, 2 * (held + incoming))
            pending = np.zeros(size, dtype=np.int64)
            pending[:held] = self._pending[head:tail]
            self._pending = pending
            self._fl[fk.P_HEAD], self._fl[fk.P_TAIL] = 0, held
        n, ri = self._n, self._ri
        lanes = ri[:n, fk.LANE] >= 0
        longest = int((ri[:n, fk.Q_TAIL] - ri[:n, fk.Q_HEAD])[lanes].max(initial=0))
        need = 3 * self._b + longest + incoming + held
        if need > self._queues.shape[1]:
            queues = np.zeros((self._queues.shape[0], max(need, 2 * self._queues.shape[1])),
                              dtype=np.int64)
            for i in np.flatnonzero(lanes).tolist():
                lane, h, t = int(ri[i, fk.LANE]), int(ri[i, fk.Q_HEAD]), int(ri[i, fk.Q_TAIL])
                queues[lane, self._b : self._b + t - h] = self._queues[lane, h:t]
                ri[i, fk.Q_HEAD], ri[i, fk.Q_TAIL] = self._b, self._b + t - h
            self._queues = queues
        return limit


# A fleet the replay drives: the event loop compiled, or `Simulator`'s in Python (a reference).
Fleet = CompiledFleet | Simulator


def _statuses(rows: NDArray[np.int64]) -> list[ReplicaStatus]:
    return [
        ReplicaStatus(index=i, state=_STATES[s], running=r, waiting=w, kv_tokens=kv,
                      iterations=it, preemptions=p)
        for i, (s, r, w, kv, it, p) in enumerate(rows.tolist())
    ]


def _records(
    recs: NDArray[np.int64], ends: NDArray[np.float64], gaps: NDArray[np.float64],
    weights: NDArray[np.int64], firsts: NDArray[np.int64], done: NDArray[np.int64],
) -> WindowRecords:
    return WindowRecords(
        replica=recs[:, fk.R_REPLICA].copy(), end_s=ends,
        iterations=recs[:, fk.R_ITERS].copy(), tokens_per_iteration=recs[:, fk.R_TOKENS].copy(),
        emitted_tokens=recs[:, fk.R_EMITTED].copy(), preemptions=recs[:, fk.R_PREEMPTS].copy(),
        gap_count=recs[:, fk.R_GAPS].copy(), gap_s=gaps, gap_weight=weights,
        first_count=recs[:, fk.R_FIRSTS].copy(), first_token_ids=firsts,
        finished_count=recs[:, fk.R_DONE].copy(), finished_ids=done,
    )  # fmt: skip
