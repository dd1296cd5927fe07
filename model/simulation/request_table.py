"""Per-request bookkeeping of the simulator: growable column arrays and a FIFO of request ids."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    from model.simulation.workloads import RequestTrace

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
_INITIAL_CAPACITY = 1024
# Values of columns not yet written, where not 0.
_FILL: Mapping[str, float] = MappingProxyType(
    {"replica": -1, "first_sched_s": np.nan, "first_token_s": np.nan, "finish_s": np.nan}
)


class RequestTable:
    """One row per request ever offered; times in s (NaN until they happen)."""

    def __init__(self) -> None:
        self.size = 0
        cap = _INITIAL_CAPACITY
        self.arrival_s = np.zeros(cap)
        self.input_tokens = np.zeros(cap, dtype=np.int64)
        self.output_tokens = np.zeros(cap, dtype=np.int64)
        self.cached_tokens = np.zeros(cap, dtype=np.int64)  # prompt prefix in the prefix cache
        self.replica = np.full(cap, -1, dtype=np.int64)
        self.rejected = np.zeros(cap, dtype=bool)
        self.first_sched_s = np.full(cap, np.nan)
        self.first_token_s = np.full(cap, np.nan)
        self.finish_s = np.full(cap, np.nan)
        self.preemptions = np.zeros(cap, dtype=np.int64)
        self.emitted = np.zeros(cap, dtype=np.int64)  # output tokens kept across a preemption
        self.last_emit_s = np.zeros(cap)

    def append(
        self,
        arrival_s: FloatArray,
        input_tokens: IntArray,
        output_tokens: IntArray,
        cached_tokens: IntArray | None = None,
    ) -> None:
        """Add requests (arrival times sorted, tokens >= 1, cached < input); row ids continue
        from `size`."""
        n = arrival_s.size
        if self.size + n > self.arrival_s.size:
            self._grow(self.size + n)
        end = self.size + n
        self.arrival_s[self.size : end] = arrival_s
        self.input_tokens[self.size : end] = input_tokens
        self.output_tokens[self.size : end] = output_tokens
        self.cached_tokens[self.size : end] = 0 if cached_tokens is None else cached_tokens
        self.size = end

    def offer(self, trace: RequestTrace, now_s: float) -> None:
        """Append a trace offered at simulated time `now_s`: its arrivals must not precede
        now or the requests already offered (both simulators' `add_requests`)."""
        if len(trace) == 0:
            return
        floor_s = max(now_s, float(self.arrival_s[self.size - 1]) if self.size else 0.0)
        if trace.arrival_s[0] < floor_s:
            raise ValueError(
                f"`arrival_s` must not precede the simulator's time or earlier requests "
                f"({floor_s}), got {trace.arrival_s[0]}"
            )
        self.append(trace.arrival_s, trace.input_tokens, trace.output_tokens, trace.cached_tokens)

    def _grow(self, needed: int) -> None:
        cap = max(needed, 2 * self.arrival_s.size)
        for name in (
            "arrival_s",
            "input_tokens",
            "output_tokens",
            "cached_tokens",
            "replica",
            "rejected",
            "first_sched_s",
            "first_token_s",
            "finish_s",
            "preemptions",
            "emitted",
            "last_emit_s",
        ):
            old = getattr(self, name)
            new = np.full(cap, _FILL.get(name, 0), dtype=old.dtype)
            new[: self.size] = old[: self.size]
            setattr(self, name, new)


class FifoQueue:
    """A FIFO of request ids over a numpy buffer, with bulk push at either end."""

    def __init__(self) -> None:
        self._buf = np.zeros(_INITIAL_CAPACITY, dtype=np.int64)
        self._head = 0
        self._tail = 0

    def __len__(self) -> int:
        return self._tail - self._head

    def __bool__(self) -> bool:
        return self._tail > self._head

    def push_back(self, ids: IntArray) -> None:
        """Append ids at the back, in order."""
        n = ids.size
        if self._tail + n > self._buf.size:
            self._rebuild(front_room=0, extra=n)
        self._buf[self._tail : self._tail + n] = ids
        self._tail += n

    def push_front(self, ids: IntArray) -> None:
        """Put ids at the front, ids[0] first."""
        n = ids.size
        if n > self._head:
            self._rebuild(front_room=n, extra=0)
        self._head -= n
        self._buf[self._head : self._head + n] = ids

    def peek(self, count: int) -> IntArray:
        """The first `count` ids (a copy)."""
        return self._buf[self._head : self._head + count].copy()

    def pop(self, count: int) -> None:
        """Drop the first `count` ids."""
        self._head += min(count, len(self))

    def raw(self, front_room: int) -> tuple[IntArray, int, int]:
        """The buffer, head and tail, with at least `front_room` free places before the head:
        for a compiled step that pops from and pushes to the front in place (then `moved`)."""
        if front_room > self._head:
            self._rebuild(front_room=front_room, extra=0)
        return self._buf, self._head, self._tail

    def moved(self, head: int) -> None:
        """The head after a compiled step popped or pushed at the front of `raw`'s buffer."""
        self._head = head

    def _rebuild(self, *, front_room: int, extra: int) -> None:
        n = len(self)
        cap = max(_INITIAL_CAPACITY, 2 * (n + front_room + extra))
        buf = np.zeros(cap, dtype=np.int64)
        buf[front_room : front_room + n] = self._buf[self._head : self._tail]
        self._buf, self._head, self._tail = buf, front_room, front_room + n
