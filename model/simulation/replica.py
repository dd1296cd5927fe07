"""One simulated vLLM replica: the V1 scheduler's engine iterations over numpy slot arrays.
The queueing model's work model (spec §2) is charged per iteration; per-slot state is numpy
arrays and one iteration is a few vector operations, never a loop over requests.

Each iteration schedules the running requests first, in admission order: a decoding request
asks for one token, a prefilling one for the rest of its prompt; the token budget M is handed
out along that order (a cumulative sum), so the first request to overrun it gets a partial
chunk and later ones nothing. Then, if no request was preempted and fewer than B run, waiting
requests are admitted first-come-first-served while budget remains, the last one possibly with
a partial chunk (chunked prefill). The iteration costs

    alpha + beta * (tokens computed) + gamma * (sum over scheduled requests of their KV length
                                                after this iteration's tokens are written),

i.e. a prefill chunk covering prompt tokens (p, p + q] reads p + q (spec §2: chunk j of c reads
j n/c) and the decode step that computes output token k (k >= 1) reads n + k (spec §2's n + k).
The iteration that completes the prompt emits the first output token, as vLLM does, so a request
with m output tokens takes c prefill iterations and m - 1 decode iterations (the model counts m
decode steps; the difference is its own approximation). With a KV capacity (tokens), the
newest running requests are preempted until the iteration fits; they rejoin the front of the
queue and recompute prompt plus generated tokens. Runs of pure-decode iterations that cannot
change the batch are advanced in one step (their times form an arithmetic progression).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
from numpy.typing import NDArray

from model.queueing.params import ServerConfig, ServiceParams
from model.simulation import step_kernel as kernel
from model.simulation.request_table import FifoQueue, RequestTable

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
_EMPTY_F = np.empty(0)
_EMPTY_I = np.empty(0, dtype=np.int64)
_EMPTY_F.setflags(write=False)
_EMPTY_I.setflags(write=False)


class ReplicaState(StrEnum):
    """Lifecycle of a replica in a fleet."""

    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    REMOVED = "removed"


@dataclass(frozen=True, slots=True, kw_only=True)
class IterationRecord:
    """What one engine iteration, or a run of `iterations` identical-size decode iterations,
    produced on one replica (times in s)."""

    replica: int
    end_s: float
    iterations: int
    tokens_per_iteration: int
    emitted_tokens: int
    preemptions: int
    gap_s: FloatArray  # inter-token gaps (s) of tokens after each request's first ...
    gap_weight: IntArray  # ... and how many tokens had each gap
    first_token_ids: IntArray  # requests whose first token came out here
    finished_ids: IntArray  # requests that finished here


class Replica:
    """Scheduler and engine of one replica; times in s, costs in ms."""

    def __init__(
        self,
        index: int,
        params: ServiceParams,
        server: ServerConfig,
        requests: RequestTable,
        *,
        kv_capacity_tokens: int | None,
        max_jump_s: float,
        record: bool,
        compiled: bool = True,
    ) -> None:
        """`compiled`: each step in one compiled call (model/simulation/step_kernel.py);
        False: the numpy code below, the reference the compiled step is tested against."""
        self.index = index
        self.state = ReplicaState.STARTING
        self.generation = 0  # bumps when the pending IterationEnd event is superseded
        self.kick_pending = False
        self.iterations = 0
        self.preemptions = 0
        self.records: list[IterationRecord] = []
        self._alpha, self._beta, self._gamma = params.as_tuple()
        self._max_seqs = server.max_batch_size
        self._budget = server.max_num_batched_tokens
        self._kv_cap = kv_capacity_tokens
        self._max_jump_ms = max_jump_s * 1000.0
        self._record = record
        self._compiled = compiled
        self._req = requests
        self.waiting = FifoQueue()
        b = self._max_seqs
        self._slots = np.zeros((kernel.SLOT_ROWS, b), dtype=np.int64)  # rows as named below
        self._slot_req = self._slots[kernel.REQ]
        self._pending = self._slots[kernel.PENDING]  # tokens to compute before the next output
        self._context = self._slots[kernel.CONTEXT]  # KV tokens written
        self._emitted = self._slots[kernel.EMITTED]
        self._n_out = self._slots[kernel.N_OUT]
        self._alloc = self._slots[kernel.ALLOC]
        self._last_emit_s = np.zeros(b)
        self.running = 0
        self.busy = False
        # The iteration in flight: start, count, first duration and per-iteration increase (ms).
        self._start_s = 0.0
        self._k = 0
        self._t0_ms = 0.0
        self._dt_ms = 0.0
        self._jump = False
        self._iter_preempted = 0

    @property
    def load(self) -> int:
        """Requests on this replica, running plus waiting."""
        return self.running + len(self.waiting)

    @property
    def kv_tokens(self) -> int:
        """KV-cache tokens held by running requests."""
        return int(self._context[: self.running].sum())

    def start_iteration(self, now_s: float) -> float | None:
        """Schedule the next iteration at now_s; its end time (s), or None when idle."""
        if self._compiled:
            return self._start_compiled(now_s)
        r = self.running
        budget = self._budget
        used = 0
        preempted = 0
        if r:
            pend = self._pending[:r]
            csum = np.cumsum(pend)
            total = int(csum[-1])
            if total <= budget:
                self._alloc[:r] = pend
                used = total
            else:
                self._alloc[:r] = np.clip(budget - (csum - pend), 0, pend)
                used = budget
            if self._kv_cap is not None:
                need = np.cumsum(self._context[:r] + self._alloc[:r])
                if need[-1] > self._kv_cap:
                    keep = max(1, int(np.searchsorted(need, self._kv_cap, side="right")))
                    preempted = r - keep
                    self._preempt(keep)
                    r = keep
                    used = int(self._alloc[:r].sum())
            batch_fixed = r == self._max_seqs or not self.waiting
            # One token each and no first token due (a 1-token prompt remainder emits one).
            if preempted == 0 and total == r <= budget and batch_fixed and self._emitted[:r].min():
                return self._start_jump(now_s)
        if preempted == 0 and r < self._max_seqs and used < budget and self.waiting:
            r = self._admit(now_s, r, budget - used)
        if r == 0:
            self.busy = False
            return None
        alloc = self._alloc[:r]
        tokens = int(alloc.sum())
        ctx = int(np.dot(self._context[:r], alloc > 0)) + tokens
        return self._begin_one(now_s, tokens, ctx, preempted)

    def _start_compiled(self, now_s: float) -> float | None:
        req = self._req
        buf, head, tail = self.waiting.raw(front_room=self.running)
        outcome, r, head, preempted, tokens, ctx = kernel.plan(
            self._slots, self._last_emit_s, self.running, self._budget,
            -1 if self._kv_cap is None else self._kv_cap, self._max_seqs, buf, head, tail,
            now_s, req.cached_tokens, req.input_tokens, req.output_tokens, req.emitted,
            req.last_emit_s, req.preemptions, req.first_sched_s,
        )  # fmt: skip
        self.waiting.moved(head)
        self.running = r
        if outcome == kernel.JUMP:
            return self._start_run(now_s, tokens, ctx)
        if outcome == kernel.IDLE:
            self.busy = False
            return None
        return self._begin_one(now_s, tokens, ctx, preempted)

    def _begin_one(self, now_s: float, tokens: int, ctx: int, preempted: int) -> float:
        """One iteration computing `tokens` and reading `ctx` KV tokens; its end (s)."""
        self._begin(now_s, 1, self._alpha + self._beta * tokens + self._gamma * ctx, 0.0, False)
        self._iter_preempted = preempted
        self.preemptions += preempted
        return self._end_s()

    def truncate_jump(self, now_s: float) -> float | None:
        """An arrival at now_s cuts a decode run at the end of the iteration in progress;
        the new end time (s), or None if nothing changes."""
        if not (self.busy and self._jump and self._k > 1):
            return None
        k = self._iterations_within((now_s - self._start_s) * 1000.0, at_least=True)
        if k >= self._k:
            return None
        self._k = k
        self.generation += 1
        return self._end_s()

    def finish_iteration(self, now_s: float) -> IterationRecord | None:
        """Apply the iteration in flight (ending at now_s); a record when recording."""
        if not self.busy:
            return None
        self.busy = False
        r = self.running
        k = self._k
        self.iterations += k
        if self._compiled:
            return self._finish_compiled(now_s, r, k)
        emitted = self._emitted[:r]
        last = self._last_emit_s[:r]
        if self._jump:
            self._context[:r] += k
            emitted += k
            first_end_s = self._start_s + self._t0_ms / 1000.0
            gaps, weights = _EMPTY_F, _EMPTY_I
            if self._record:
                rest = (self._t0_ms + self._dt_ms * np.arange(1, k)) / 1000.0
                gaps = np.concatenate((first_end_s - last, rest))
                weights = np.concatenate((np.ones(r, dtype=np.int64), np.full(k - 1, r)))
            last[:] = now_s
            done = emitted >= self._n_out[:r]
            first_ids = _EMPTY_I
            n_emitted, tokens = k * r, r
        else:
            alloc = self._alloc[:r]
            self._pending[:r] -= alloc
            self._context[:r] += alloc
            emit = self._pending[:r] == 0
            first = emit & (emitted == 0)
            later = emit & ~first
            gaps = now_s - last[later]
            weights = np.ones(gaps.size, dtype=np.int64)
            emitted += emit
            last[emit] = now_s
            first_ids = self._slot_req[:r][first]
            self._req.first_token_s[first_ids] = now_s
            done = emit & (emitted >= self._n_out[:r])
            self._pending[:r][emit & ~done] = 1
            n_emitted, tokens = int(emit.sum()), int(alloc.sum())
        finished = self._slot_req[:r][done]
        if finished.size:
            self._req.finish_s[finished] = now_s
            self._compact(~done)
        return self._recorded(now_s, k, tokens, n_emitted, gaps, weights, first_ids, finished)

    def _finish_compiled(self, now_s: float, r: int, k: int) -> IterationRecord | None:
        req = self._req
        if self._jump:
            first_end_s = self._start_s + self._t0_ms / 1000.0
            self.running, gaps, weights, finished = kernel.apply_jump(
                self._slots, self._last_emit_s, r, k, now_s, first_end_s, self._t0_ms,
                self._dt_ms, self._record, req.finish_s)
            first_ids, n_emitted, tokens = _EMPTY_I, k * r, r
        else:
            self.running, n_emitted, tokens, gaps, weights, first_ids, finished = (
                kernel.apply_iteration(self._slots, self._last_emit_s, r, now_s,
                                       req.first_token_s, req.finish_s))
        return self._recorded(now_s, k, tokens, n_emitted, gaps, weights, first_ids, finished)

    def _recorded(
        self, now_s: float, k: int, tokens: int, n_emitted: int, gaps: FloatArray,
        weights: IntArray, first_ids: IntArray, finished: IntArray,
    ) -> IterationRecord | None:
        """The record of the iteration just applied, when recording."""
        if not self._record:
            return None
        for arr in (gaps, weights, first_ids, finished):
            arr.setflags(write=False)
        return IterationRecord(
            replica=self.index,
            end_s=now_s,
            iterations=k,
            tokens_per_iteration=int(tokens),
            emitted_tokens=n_emitted,
            preemptions=self._iter_preempted,
            gap_s=gaps,
            gap_weight=weights,
            first_token_ids=first_ids,
            finished_ids=finished,
        )

    def _start_jump(self, now_s: float) -> float:
        r = self.running
        k = int(np.min(self._n_out[:r] - self._emitted[:r]))
        context = int(self._context[:r].sum())
        if self._kv_cap is not None:
            k = min(k, max(1, (self._kv_cap - context) // r))
        return self._start_run(now_s, k, context)

    def _start_run(self, now_s: float, k: int, context: int) -> float:
        """A run of up to k one-token decode iterations over `context` KV tokens; its end."""
        r = self.running
        t0 = self._alpha + self._beta * r + self._gamma * (context + r)
        self._begin(now_s, k, t0, self._gamma * r, True)
        if k > 1 and math.isfinite(self._max_jump_ms):
            self._k = min(k, max(1, self._iterations_within(self._max_jump_ms, at_least=False)))
        self._iter_preempted = 0
        return self._end_s()

    def _begin(self, now_s: float, k: int, t0_ms: float, dt_ms: float, jump: bool) -> None:
        self.busy = True
        self._start_s, self._k, self._t0_ms, self._dt_ms, self._jump = now_s, k, t0_ms, dt_ms, jump

    def _total_ms(self, k: int) -> float:
        return k * self._t0_ms + self._dt_ms * k * (k - 1) / 2.0

    def _end_s(self) -> float:
        return self._start_s + self._total_ms(self._k) / 1000.0

    def _iterations_within(self, elapsed_ms: float, *, at_least: bool) -> int:
        """Smallest k >= 1 with total(k) >= elapsed (at_least) or largest k with total(k) <=
        elapsed; total(k) = k t0 + dt k(k-1)/2 is increasing."""
        a, b = self._dt_ms / 2.0, self._t0_ms - self._dt_ms / 2.0
        root = elapsed_ms / b if a <= 0 else (-b + math.sqrt(b * b + 4 * a * elapsed_ms)) / (2 * a)
        k = max(1, int(math.floor(root)) - 1)
        if at_least:
            while self._total_ms(k) < elapsed_ms:
                k += 1
            return k
        while self._total_ms(k + 1) <= elapsed_ms:
            k += 1
        return k

    def _admit(self, now_s: float, r: int, budget_left: int) -> int:
        """Admit waiting requests FCFS into slots r.. with the budget left; new running count."""
        k_max = min(self._max_seqs - r, len(self.waiting), budget_left)
        head = self.waiting.peek(k_max)
        req = self._req
        # A cached prompt prefix is neither computed nor charged, but its KV is held (prefix
        # caching); preempted requests recompute their outputs.
        cached = req.cached_tokens[head]
        prompts = req.input_tokens[head] - cached + req.emitted[head]
        prev = np.cumsum(prompts) - prompts
        n = int(np.searchsorted(prev, budget_left, side="left"))
        alloc = np.minimum(prompts[:n], budget_left - prev[:n])
        if self._kv_cap is not None:
            kv_free = self._kv_cap - int((self._context[:r] + self._alloc[:r]).sum())
            held = np.cumsum(alloc + cached[:n])
            n = min(n, int(np.searchsorted(held, kv_free, side="right")))
            alloc = alloc[:n]
        if n == 0:
            return r
        ids = head[:n]
        self.waiting.pop(n)
        end = r + n
        self._slot_req[r:end] = ids
        self._pending[r:end] = prompts[:n]
        self._context[r:end] = cached[:n]
        self._emitted[r:end] = req.emitted[ids]
        self._n_out[r:end] = req.output_tokens[ids]
        self._last_emit_s[r:end] = req.last_emit_s[ids]
        self._alloc[r:end] = alloc
        fresh = ids[np.isnan(req.first_sched_s[ids])]
        req.first_sched_s[fresh] = now_s
        self.running = end
        return end

    def _preempt(self, keep: int) -> None:
        """Send running slots keep.. (the newest) back to the front of the queue."""
        r = self.running
        ids = self._slot_req[keep:r].copy()
        self._req.emitted[ids] = self._emitted[keep:r]
        self._req.last_emit_s[ids] = self._last_emit_s[keep:r]
        self._req.preemptions[ids] += 1
        self.waiting.push_front(ids)
        self.running = keep

    def _compact(self, keep: NDArray[np.bool_]) -> None:
        r = self.running
        n = int(keep.sum())
        for arr in (
            self._slot_req,
            self._pending,
            self._context,
            self._emitted,
            self._n_out,
            self._last_emit_s,
        ):
            arr[:n] = arr[:r][keep]
        self.running = n
