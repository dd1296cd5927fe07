"""Which pods' counters a window may use once a URL's counters fell. collector-spec §7.4.

A pod URL whose counters fall without a restart answers for more than one process: a Service
in front of several pods. Process start times tell most such pods apart (`continuity`), but
pods of one rollout can start in the same second. Then a window from the lower pod's read to
the higher pod's looks like an ordinary rise and charges the gap between the two processes'
totals (hundreds of requests) to one window. So once a pod has fallen:
- the next window starts from the highest read before the fall (its high-water mark), not from
  the fallen read: a later read of the higher process is measured against that process;
- the pod stays distrusted (its windows are unusable) until its counters have risen
  consistently for `TRUST_AFTER` windows in a row;
- a pod whose reads stay below the mark for `HOLD_LIMIT` windows has moved to another process
  for good: the mark is dropped and the latest read becomes the base (still distrusted).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from exporter.collector.pod_observation import Continuity, continuity
from exporter.collector.sources import SourceRead
from exporter.collector.vllm_metrics import PodSample

# Consistent windows in a row before a pod that fell is used again. A shared URL read in a
# random order yields runs of consistent reads of one process; three in a row is 1 in 8 for
# each start, and those windows measure that process alone.
TRUST_AFTER = 3
# Windows in a row below the high-water mark before the pod is taken to have moved for good.
HOLD_LIMIT = 10


@dataclass(slots=True)
class _Suspect:
    """A pod that fell: the base its next window starts from, and its counts (windows)."""

    base: PodSample
    below: int = 0  # reads in a row below the base
    risen: int = 0  # consistent windows in a row since the last fall


class CounterTrust:
    """The per-pod window bases of one deployment and the pods whose counters are distrusted."""

    def __init__(self) -> None:
        self._suspects: dict[str, _Suspect] = {}

    def bases(self, previous: SourceRead) -> SourceRead:
        """`previous` with each distrusted pod's sample replaced by its base."""
        if not self._suspects:  # the usual case: nothing to replace, nothing to copy
            return previous
        samples = {s.pod: s for s in previous.samples}
        samples.update({pod: s.base for pod, s in self._suspects.items()})
        return SourceRead(previous.time_s, tuple(samples.values()), previous.failures)

    def update(
        self, bases: SourceRead, read: SourceRead, fell: frozenset[str] = frozenset()
    ) -> frozenset[str]:
        """Take in `read` (whose windows start at `bases`); `fell` names pods another reader
        (the arrival sampler) saw fall within the window. The pods whose window is unusable
        because their counters are distrusted (a fall in this window included)."""
        before: Mapping[str, PodSample] = {s.pod: s for s in bases.samples if s.ok}
        distrusted: set[str] = set()
        for sample in read.samples:
            base = before.get(sample.pod)
            if not sample.ok or base is None or sample.time_s <= base.time_s:
                continue
            below = continuity(base, sample) is Continuity.INCONSISTENT
            suspect = self._suspects.get(sample.pod)
            if suspect is None:
                if not (below or sample.pod in fell):
                    continue
                suspect = self._suspects[sample.pod] = _Suspect(base)
            distrusted.add(sample.pod)
            if below:  # keep the high-water mark, unless the pod has moved for good
                suspect.below += 1
                if suspect.below >= HOLD_LIMIT:
                    suspect.base, suspect.below = sample, 0
            else:
                suspect.base, suspect.below = sample, 0
            if below or sample.pod in fell:
                suspect.risen = 0
            else:
                suspect.risen += 1
                if suspect.risen >= TRUST_AFTER:
                    del self._suspects[sample.pod]
        known = {s.pod for s in read.samples} | {f.pod for f in read.failures}
        for pod in self._suspects.keys() - known:  # gone: a later pod of that name starts anew
            del self._suspects[pod]
        return frozenset(distrusted)
