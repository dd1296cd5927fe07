"""A window's iteration records as columns: what the compiled event loop hands back
(model/simulation/fleet_kernel.py), readable as the `IterationRecord`s they stand for.

A replay window holds thousands of records; building one object per record cost more than the
iterations themselves (issue 45). The columns keep the records' order, and each flat array
(gaps, first tokens, finished requests) is the records' arrays joined in that order, so sums
over them are the sums over the records, float for float.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np
from numpy.typing import NDArray

from model.simulation.replica import IterationRecord

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


def _offsets(counts: IntArray) -> IntArray:
    out = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


@dataclass(frozen=True, slots=True, eq=False)
class WindowRecords(Sequence[IterationRecord]):
    """Iteration records, one row each; the flat arrays hold `*_count[k]` items of record k,
    record after record."""

    replica: IntArray
    end_s: FloatArray
    iterations: IntArray
    tokens_per_iteration: IntArray
    emitted_tokens: IntArray
    preemptions: IntArray
    gap_count: IntArray
    gap_s: FloatArray
    gap_weight: IntArray
    first_count: IntArray
    first_token_ids: IntArray
    finished_count: IntArray
    finished_ids: IntArray

    @classmethod
    def empty(cls) -> WindowRecords:
        i, f = np.empty(0, dtype=np.int64), np.empty(0)
        return cls(i, f, i, i, i, i, i, f, i, i, i, i, i)

    @classmethod
    def of(cls, records: Sequence[IterationRecord]) -> WindowRecords:
        """`records` as columns (themselves when they are)."""
        if isinstance(records, WindowRecords):
            return records
        if not records:
            return cls.empty()

        def ints(values: list[int]) -> IntArray:
            return np.array(values, dtype=np.int64)

        def joined(arrays: list[NDArray[np.int64]]) -> IntArray:
            return np.concatenate(arrays).astype(np.int64, copy=False)

        rs = list(records)
        return cls(
            replica=ints([r.replica for r in rs]),
            end_s=np.array([r.end_s for r in rs], dtype=np.float64),
            iterations=ints([r.iterations for r in rs]),
            tokens_per_iteration=ints([r.tokens_per_iteration for r in rs]),
            emitted_tokens=ints([r.emitted_tokens for r in rs]),
            preemptions=ints([r.preemptions for r in rs]),
            gap_count=ints([r.gap_s.size for r in rs]),
            gap_s=np.concatenate([r.gap_s for r in rs]).astype(np.float64, copy=False),
            gap_weight=joined([r.gap_weight for r in rs]),
            first_count=ints([r.first_token_ids.size for r in rs]),
            first_token_ids=joined([r.first_token_ids for r in rs]),
            finished_count=ints([r.finished_ids.size for r in rs]),
            finished_ids=joined([r.finished_ids for r in rs]),
        )

    @classmethod
    def concat(cls, parts: Sequence[WindowRecords]) -> WindowRecords:
        """The parts' records one after the other."""
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return cls.empty()
        names = cls.__dataclass_fields__
        return cls(**{n: np.concatenate([getattr(p, n) for p in parts]) for n in names})

    def select(self, rows: NDArray[np.bool_]) -> WindowRecords:
        """The records where `rows` holds, in order."""
        gaps = np.repeat(rows, self.gap_count)
        firsts = np.repeat(rows, self.first_count)
        done = np.repeat(rows, self.finished_count)
        return WindowRecords(
            self.replica[rows], self.end_s[rows], self.iterations[rows],
            self.tokens_per_iteration[rows], self.emitted_tokens[rows], self.preemptions[rows],
            self.gap_count[rows], self.gap_s[gaps], self.gap_weight[gaps],
            self.first_count[rows], self.first_token_ids[firsts],
            self.finished_count[rows], self.finished_ids[done],
        )  # fmt: skip

    def by_replica(self) -> WindowRecords:
        """The records replica by replica (each one's in order), as `Simulator` drains them."""
        if self.replica.size < 2 or bool(np.all(self.replica[1:] >= self.replica[:-1])):
            return self
        order = np.argsort(self.replica, kind="stable")

        def moved(counts: IntArray) -> IntArray:
            starts = _offsets(counts)[:-1][order]
            sizes = counts[order]
            new_starts = _offsets(sizes)[:-1]
            return np.repeat(starts - new_starts, sizes) + np.arange(int(sizes.sum()))

        gaps, firsts, done = (moved(c) for c in (self.gap_count, self.first_count,
                                                 self.finished_count))
        return WindowRecords(
            self.replica[order], self.end_s[order], self.iterations[order],
            self.tokens_per_iteration[order], self.emitted_tokens[order],
            self.preemptions[order], self.gap_count[order], self.gap_s[gaps],
            self.gap_weight[gaps], self.first_count[order], self.first_token_ids[firsts],
            self.finished_count[order], self.finished_ids[done],
        )  # fmt: skip

    def __len__(self) -> int:
        return int(self.replica.size)

    @overload
    def __getitem__(self, index: int) -> IterationRecord: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[IterationRecord]: ...

    def __getitem__(self, index: int | slice) -> IterationRecord | Sequence[IterationRecord]:
        if isinstance(index, slice):
            return [self[k] for k in range(*index.indices(len(self)))]
        return self._record(range(len(self))[index], self._offsets())

    def __iter__(self) -> Iterator[IterationRecord]:
        offsets = self._offsets()
        for k in range(len(self)):
            yield self._record(k, offsets)

    def _offsets(self) -> tuple[IntArray, IntArray, IntArray]:
        """Where each record's gaps, first tokens and finished requests start and end."""
        return _offsets(self.gap_count), _offsets(self.first_count), _offsets(self.finished_count)

    def _record(self, k: int, offsets: tuple[IntArray, IntArray, IntArray]) -> IterationRecord:
        g, f, d = offsets
        return IterationRecord(
            replica=int(self.replica[k]),
            end_s=float(self.end_s[k]),
            iterations=int(self.iterations[k]),
            tokens_per_iteration=int(self.tokens_per_iteration[k]),
            emitted_tokens=int(self.emitted_tokens[k]),
            preemptions=int(self.preemptions[k]),
            gap_s=self.gap_s[g[k] : g[k + 1]],
            gap_weight=self.gap_weight[g[k] : g[k + 1]],
            first_token_ids=self.first_token_ids[f[k] : f[k + 1]],
            finished_ids=self.finished_ids[d[k] : d[k + 1]],
        )
