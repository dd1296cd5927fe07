"""Discrete-event simulation of a fleet of continuous-batching vLLM replicas behind a router.
Each iteration costs alpha + beta (tokens) + gamma (KV reads) (spec §2; see `replica.py`). An
event heap driven by peek() / step() / run(until_s), with the results in a frozen SimResult.

Events are `(time_s, priority, seq, event)` on a heap; at equal times a replica becoming ready
goes first, then arrivals, then iteration ends (so a request arriving exactly when an iteration
ends joins the next one), and `seq` keeps ties FIFO. Replicas added with `set_replicas` become
ready after `startup_delay_s`; removed ones first stop receiving requests, finish what they hold
(running and queued) and then disappear. Arrivals that find no ready replica wait in a fleet
queue until one is ready. With `server.max_queue_size` set, an arrival that finds its replica's
queue full is rejected (vLLM's admission limit); so is a request longer than the KV capacity.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum, StrEnum

import numpy as np
from numpy.typing import NDArray

from model.queueing.params import ServerConfig, ServiceParams
from model.queueing.validation import require_int_at_least, require_non_negative
from model.simulation.replica import IterationRecord, Replica, ReplicaState
from model.simulation.request_table import FifoQueue, RequestTable
from model.simulation.workloads import RequestTrace

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


class Priority(IntEnum):
    """Tie order of events at equal time, lower first (a modelling rule; tested)."""

    REPLICA_READY = 0
    ARRIVAL = 1
    ITERATION_END = 2


class Router(StrEnum):
    """How the fleet picks a ready replica for an arrival."""

    ROUND_ROBIN = "round-robin"
    LEAST_LOADED = "least-loaded"  # fewest running + waiting, lowest index on ties


@dataclass(frozen=True, slots=True)
class Arrival:
    """Request `request` arrives."""

    request: int


@dataclass(frozen=True, slots=True)
class IterationEnd:
    """The iteration in flight on `replica` ends (stale unless `generation` is current)."""

    replica: int
    generation: int


@dataclass(frozen=True, slots=True)
class ReplicaReady:
    """Replica `replica` finished starting up."""

    replica: int


Event = Arrival | IterationEnd | ReplicaReady


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaStatus:
    """A replica's state at the simulator's current time."""

    index: int
    state: ReplicaState
    running: int
    waiting: int
    kv_tokens: int
    iterations: int
    preemptions: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SimResult:
    """Per-request records of the requests that arrived by `end_s` (arrival order); times in
    s, latencies in ms, NaN where not (yet) defined. ITL is the request's mean gap between
    output tokens, (finish - first token)/(m - 1), NaN for m = 1."""

    end_s: float
    arrived: int
    completed: int
    in_system: int
    rejected: int
    iterations: int
    preemptions: int
    arrival_s: FloatArray
    input_tokens: IntArray
    output_tokens: IntArray
    replica: IntArray
    first_token_s: FloatArray
    finish_s: FloatArray
    queue_ms: FloatArray
    ttft_ms: FloatArray
    itl_ms: FloatArray
    e2e_ms: FloatArray
    request_preemptions: IntArray

    def finished_between(self, start_s: float, end_s: float) -> NDArray[np.bool_]:
        """Mask of requests that finished in (start_s, end_s]."""
        with np.errstate(invalid="ignore"):
            return (self.finish_s > start_s) & (self.finish_s <= end_s)

    def arrived_between(self, start_s: float, end_s: float) -> NDArray[np.bool_]:
        """Mask of requests that arrived in (start_s, end_s]."""
        return (self.arrival_s > start_s) & (self.arrival_s <= end_s)


def check_fleet_arguments(replicas: int, kv_capacity_tokens: int | None, max_jump_s: float) -> None:
    """The checks both simulators (this one and compiled_fleet.CompiledFleet) make on their
    fleet's arguments."""
    require_int_at_least("replicas", replicas, 0)
    if kv_capacity_tokens is not None:
        require_int_at_least("kv_capacity_tokens", kv_capacity_tokens, 1)
    if not (isinstance(max_jump_s, int | float) and max_jump_s > 0):
        raise ValueError(f"`max_jump_s` must be a number > 0 (inf allowed), got {max_jump_s}")


class Simulator:
    """A fleet of simulated vLLM replicas; times in s."""

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
        record_iterations: bool = False,
        compiled_step: bool = True,
    ) -> None:
        """`compiled_step`: each replica's engine step compiled (model/simulation/
        step_kernel.py); False: numpy, the reference it is tested against (same results)."""
        check_fleet_arguments(replicas, kv_capacity_tokens, max_jump_s)
        self._params = params
        self._server = server
        self._router = Router(router)
        self._kv_cap = kv_capacity_tokens
        self._startup_delay_s = require_non_negative("startup_delay_s", startup_delay_s)
        self._max_jump_s = float(max_jump_s)
        self._record = record_iterations
        self._compiled_step = compiled_step
        self._requests = RequestTable()
        self._replicas: list[Replica] = []
        self._pending = FifoQueue()  # arrivals waiting for any ready replica
        self._heap: list[tuple[float, int, int, Event]] = []
        self._seq = itertools.count()
        self._now_s = 0.0
        self._next_arrival = 0  # first request row not yet pushed as an Arrival event
        self._arrival_queued = False
        self._rr = 0
        for _ in range(replicas):
            self._new_replica().state = ReplicaState.READY

    @property
    def now_s(self) -> float:
        """Simulated time (s)."""
        return self._now_s

    @property
    def requests(self) -> RequestTable:
        """The live per-request table (read it, never write it)."""
        return self._requests

    def add_requests(self, trace: RequestTrace) -> None:
        """Offer more requests; their arrivals must not precede now or earlier offers."""
        if len(trace) == 0:
            return
        self._requests.offer(trace, self._now_s)
        self._queue_next_arrival()

    def set_replicas(self, count: int) -> None:
        """Scale to `count` replicas now: add (ready after the startup delay) or drain."""
        count = require_int_at_least("count", count, 0)
        live = (ReplicaState.STARTING, ReplicaState.READY)
        active = [r for r in self._replicas if r.state in live]
        if count > len(active):
            for _ in range(count - len(active)):
                replica = self._new_replica()
                self._push(
                    self._now_s + self._startup_delay_s,
                    Priority.REPLICA_READY,
                    ReplicaReady(replica.index),
                )
            return
        self._retire(active, len(active) - count)

    @staticmethod
    def _retire(active: Sequence[Replica], surplus: int) -> None:
        """Take `surplus` of the `active` replicas away: those still starting are cancelled
        before serving ones drain, newest first; an idle one is removed at once."""
        victims = sorted(active, key=lambda r: (r.state is ReplicaState.READY, -r.index))[:surplus]
        for replica in victims:
            if replica.state is ReplicaState.STARTING or replica.load == 0:
                replica.state = ReplicaState.REMOVED
            else:
                replica.state = ReplicaState.DRAINING

    def replica_status(self) -> list[ReplicaStatus]:
        """Every replica ever created, by index."""
        return [
            ReplicaStatus(
                index=r.index,
                state=r.state,
                running=r.running,
                waiting=len(r.waiting),
                kv_tokens=r.kv_tokens,
                iterations=r.iterations,
                preemptions=r.preemptions,
            )
            for r in self._replicas
        ]

    def drain_records(self) -> list[IterationRecord]:
        """Iteration records since the last call (empty unless record_iterations)."""
        out: list[IterationRecord] = []
        for replica in self._replicas:
            out.extend(replica.records)
            replica.records.clear()
        return out

    def peek(self) -> float:
        """Time (s) of the next event, or inf."""
        return self._heap[0][0] if self._heap else math.inf

    def step(self) -> None:
        """Process one event."""
        self._now_s, _, _, event = heapq.heappop(self._heap)
        match event:
            case Arrival():
                self._on_arrival(event)
            case IterationEnd():
                self._on_iteration_end(event)
            case ReplicaReady():
                self._on_replica_ready(event)

    def run(self, until_s: float = math.inf) -> SimResult:
        """Process every event at or before until_s (default: until none is left)."""
        self.advance(until_s)
        return self.result()

    def advance(self, until_s: float) -> None:
        """`run` without building its result (a copy of every request so far): for callers
        that stop many times on a long run."""
        while self._heap and self._heap[0][0] <= until_s:
            self.step()
        if math.isfinite(until_s):
            self._now_s = max(self._now_s, until_s)

    def result(self) -> SimResult:
        """Records of every request that has arrived so far."""
        n = self._next_arrival - (1 if self._arrival_queued else 0)
        return table_result(self._requests, n, self._now_s,
                            sum(r.iterations for r in self._replicas),
                            sum(r.preemptions for r in self._replicas))

    # -- event handlers -----------------------------------------------------------------------

    def _on_arrival(self, event: Arrival) -> None:
        self._arrival_queued = False
        self._queue_next_arrival()
        req = event.request
        t = self._requests
        if self._kv_cap is not None and t.input_tokens[req] + t.output_tokens[req] > self._kv_cap:
            t.rejected[req] = True
            return
        ready = [r for r in self._replicas if r.state is ReplicaState.READY]
        if not ready:
            self._pending.push_back(np.array([req], dtype=np.int64))
            return
        self._dispatch(req, ready)

    def _dispatch(self, req: int, ready: list[Replica]) -> None:
        if self._router is Router.LEAST_LOADED:
            replica = min(ready, key=lambda r: (r.load, r.index))
        else:
            replica = ready[self._rr % len(ready)]
            self._rr += 1
        self._enqueue(req, replica, self._server.max_queue_size)

    def _enqueue(self, req: int, replica: Replica, limit: int | None) -> None:
        """Request `req` into `replica`'s waiting queue, or rejected when `limit` requests
        already wait there; an idle replica is kicked, a busy one's jump cut at now."""
        self._requests.replica[req] = replica.index  # kept for rejections: they are per replica
        if limit is not None and len(replica.waiting) >= limit:
            self._requests.rejected[req] = True
            return
        replica.waiting.push_back(np.array([req], dtype=np.int64))
        if replica.busy:
            end_s = replica.truncate_jump(self._now_s)
            if end_s is not None:
                self._push_iteration_end(replica, end_s)
        elif not replica.kick_pending:
            replica.kick_pending = True
            self._push_iteration_end(replica, self._now_s)

    def _on_iteration_end(self, event: IterationEnd) -> None:
        replica = self._replicas[event.replica]
        if event.generation != replica.generation or replica.state is ReplicaState.REMOVED:
            return
        replica.kick_pending = False
        record = replica.finish_iteration(self._now_s)
        if record is not None:
            replica.records.append(record)
        if replica.state is ReplicaState.DRAINING and replica.load == 0:
            replica.state = ReplicaState.REMOVED
            return
        end_s = replica.start_iteration(self._now_s)
        if end_s is not None:
            self._push_iteration_end(replica, end_s)

    def _on_replica_ready(self, event: ReplicaReady) -> None:
        replica = self._replicas[event.replica]
        if replica.state is not ReplicaState.STARTING:
            return  # cancelled while starting
        replica.state = ReplicaState.READY
        ready = [r for r in self._replicas if r.state is ReplicaState.READY]
        held = self._pending.peek(len(self._pending))
        self._pending.pop(len(held))
        for req in held.tolist():
            self._dispatch(req, ready)

    # -- helpers ------------------------------------------------------------------------------

    def _new_replica(self) -> Replica:
        replica = Replica(
            len(self._replicas),
            self._params,
            self._server,
            self._requests,
            kv_capacity_tokens=self._kv_cap,
            max_jump_s=self._max_jump_s,
            record=self._record,
            compiled=self._compiled_step,
        )
        self._replicas.append(replica)
        return replica

    def _queue_next_arrival(self) -> None:
        if self._arrival_queued or self._next_arrival >= self._requests.size:
            return
        req = self._next_arrival
        self._next_arrival += 1
        self._arrival_queued = True
        self._push(float(self._requests.arrival_s[req]), Priority.ARRIVAL, Arrival(req))

    def _push_iteration_end(self, replica: Replica, end_s: float) -> None:
        self._push(
            max(end_s, self._now_s),
            Priority.ITERATION_END,
            IterationEnd(replica.index, replica.generation),
        )

    def _push(self, time_s: float, priority: Priority, event: Event) -> None:
        heapq.heappush(self._heap, (time_s, int(priority), next(self._seq), event))


def table_result(
    t: RequestTable, n: int, end_s: float, iterations: int, preemptions: int
) -> SimResult:
    """The records of the first `n` requests of `t` (those arrived by `end_s`)."""
    arrival = t.arrival_s[:n].copy()
    n_out = t.output_tokens[:n].copy()
    first, finish = t.first_token_s[:n].copy(), t.finish_s[:n].copy()
    with np.errstate(invalid="ignore", divide="ignore"):
        itl = np.where(n_out > 1, (finish - first) * 1000.0 / (n_out - 1), np.nan)
    completed = int(np.count_nonzero(~np.isnan(finish)))
    rejected = int(np.count_nonzero(t.rejected[:n]))
    arrays = {
        "arrival_s": arrival,
        "input_tokens": t.input_tokens[:n].copy(),
        "output_tokens": n_out,
        "replica": t.replica[:n].copy(),
        "first_token_s": first,
        "finish_s": finish,
        "queue_ms": (t.first_sched_s[:n] - arrival) * 1000.0,
        "ttft_ms": (first - arrival) * 1000.0,
        "itl_ms": itl,
        "e2e_ms": (finish - arrival) * 1000.0,
        "request_preemptions": t.preemptions[:n].copy(),
    }
    for arr in arrays.values():
        arr.setflags(write=False)
    return SimResult(
        end_s=end_s,
        arrived=n,
        completed=completed,
        in_system=n - completed - rejected,
        rejected=rejected,
        iterations=iterations,
        preemptions=preemptions,
        **arrays,
    )


def simulate(
    params: ServiceParams,
    server: ServerConfig,
    trace: RequestTrace,
    *,
    replicas: int = 1,
    router: Router = Router.ROUND_ROBIN,
    kv_capacity_tokens: int | None = None,
    until_s: float = math.inf,
) -> SimResult:
    """Run a trace through `replicas` replicas until all requests are done (or until_s)."""
    sim = Simulator(
        params, server, replicas=replicas, router=router, kv_capacity_tokens=kv_capacity_tokens
    )
    sim.add_requests(trace)
    return sim.run(until_s)
