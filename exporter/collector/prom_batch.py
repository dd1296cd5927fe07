"""Many deployments' series in one Prometheus query. collector-spec §5.

Each deployment's selector becomes one branch of a union, tagged with the deployment's name by
`label_replace`, so Prometheus attributes every series itself (whatever matchers a selector
uses) and two overlapping selectors keep both copies apart. A batch then costs two queries per
cycle (the series, and their scrape times) whatever the number of its deployments (build_sources
puts up to 100 in one, so that an answer stays far below the response cap): the load on
Prometheus grows with the series read, not with a query per deployment.

The reader threads of a cycle ask for their deployment's part at about the same moment: the first
one queries (under the lock, so the others wait for its answer instead of querying again), the
others take their part. A deployment asking again after it took its part starts the next batch; so
does any request once the batch is older than `max_age_s`, so a late reader never gets an old
cycle's values.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from exporter.base.clock import Clock
from exporter.base.errors import SourceError
from exporter.collector.promapi import PrometheusClient, VectorSample

# The label that carries a series' deployment through the union; dropped before the series are
# read, so nothing downstream sees it. Unlikely to clash with a label of vLLM or a target.
TAG_LABEL = "vllm_sizer_deployment_"
DEFAULT_MAX_AGE_S = 5.0


@dataclass(frozen=True, slots=True)
class BatchPart:
    """One deployment's share of a batch: its series and its pods' scrape times at `time_s`."""

    time_s: float
    values: tuple[VectorSample, ...]
    stamps: tuple[VectorSample, ...]


@dataclass(slots=True)
class _Batch:
    key: float | None  # None: a read of "now"; else the time asked for (a look back)
    queried_s: float  # clock time of the query
    parts: Mapping[str, BatchPart] | SourceError
    unserved: set[str] = field(default_factory=set)


def tagged(selector: str, name: str) -> str:
    """`selector` with every series labelled TAG_LABEL=name (names are RFC 1123: no quoting)."""
    return f'label_replace({selector}, "{TAG_LABEL}", "{name}", "__name__", ".*")'


class PrometheusBatch:
    """The series of several deployments (name -> selector) read with one query per cycle."""

    def __init__(
        self,
        *,
        client: PrometheusClient,
        clock: Clock,
        selectors: Mapping[str, str],
        pod_label: str,
        max_age_s: float = DEFAULT_MAX_AGE_S,
    ) -> None:
        if not selectors:
            raise ValueError("`selectors` must name at least one deployment, got none")
        self._client = client
        self._clock = clock
        self._names = frozenset(selectors)
        self._max_age_s = max_age_s
        union = " or ".join(tagged(sel, name) for name, sel in sorted(selectors.items()))
        self.series_query = union
        named = f'label_replace({union}, "name_", "$1", "__name__", "(.+)")'
        self.timestamp_query = f"max by ({TAG_LABEL}, {pod_label}) (timestamp({named}))"
        self._lock = threading.Lock()
        # At most two live batches: this cycle's read of now and, on a first cycle, its look back.
        self._batches: dict[float | None, _Batch] = {}

    def part(self, name: str, time_s: float | None = None) -> BatchPart:
        """`name`'s series as of `time_s` (None: now); SourceError when the batch query failed."""
        if name not in self._names:
            raise KeyError(f"no deployment {name!r} in this batch")
        with self._lock:
            now = self._clock.time()
            for key in [k for k, b in self._batches.items() if now - b.queried_s > self._max_age_s]:
                del self._batches[key]
            batch = self._batches.get(time_s)
            if batch is None or name not in batch.unserved:
                parts = self._query(now if time_s is None else time_s)
                batch = self._batches[time_s] = _Batch(time_s, now, parts, set(self._names))
            batch.unserved.discard(name)
            if isinstance(batch.parts, SourceError):
                raise batch.parts
            return batch.parts[name]

    def _query(self, time_s: float) -> Mapping[str, BatchPart] | SourceError:
        try:
            values = self._client.query(self.series_query, time_s=time_s)
            stamps = self._client.query(self.timestamp_query, time_s=time_s)
        except SourceError as exc:  # every deployment of the batch sees the same failure
            return exc
        by_name: dict[str, tuple[list[VectorSample], list[VectorSample]]] = {
            name: ([], []) for name in self._names
        }
        for index, samples in enumerate((values, stamps)):
            for sample in samples:
                owner = sample.labels.get(TAG_LABEL)
                if owner in by_name:
                    by_name[owner][index].append(_untagged(sample))
        return MappingProxyType(
            {
                name: BatchPart(time_s, tuple(vals), tuple(stmps))
                for name, (vals, stmps) in by_name.items()
            }
        )


def _untagged(sample: VectorSample) -> VectorSample:
    labels = {k: v for k, v in sample.labels.items() if k != TAG_LABEL}
    return VectorSample(MappingProxyType(labels), sample.time_s, sample.value)
