"""A simulated replica's /metrics read as values: the `PodSample` the collector's parser makes of
the emulator's exposition text (exporter/replay/exposition.py), built from the emulator's
counters, gauges and histograms without rendering and parsing the text.

The text round trip is exact (prometheus-client writes a float's shortest repr, the parser
reads it back; `le` labels are the bounds' repr), so the sample is the parser's value for
value; the observer still reads a sample of windows through the text and checks that
(`ExpositionObserver`'s `text_every`), and tests/exporter/replay/test_pod_values.py compares the
two on every read of a replay. Only what the emulator exports is covered: one engine, one
model, the current metric names, no legacy alias; a value the parser would reject (negative
or not finite) gives None, and the caller reads the text instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType

from exporter.collector.vllm_buckets import CumulativeBuckets
from exporter.collector.vllm_metrics import (
    BUCKETED,
    CounterName,
    GaugeName,
    HistogramName,
    HistogramTotals,
    PodSample,
    SampleStatus,
)
from exporter.testbed.emulator_metrics import ReplicaMetrics

# Each signal the collector reads -> the emulator's own key for it.
_COUNTERS: Mapping[CounterName, str] = MappingProxyType({
    CounterName.REQUEST_SUCCESS: "success",
    CounterName.PROMPT_TOKENS: "prompt",
    CounterName.GENERATION_TOKENS: "generation",
    CounterName.PREEMPTIONS: "preemptions",
    CounterName.PROMPT_TOKENS_CACHED: "cached",
    CounterName.PREFIX_CACHE_HITS: "cached",  # the device tier: every hit is local
    CounterName.PREFIX_CACHE_QUERIES: "prompt",  # every prompt token is looked up
})
_GAUGES: Mapping[GaugeName, str] = MappingProxyType({
    GaugeName.RUNNING: "running", GaugeName.WAITING: "waiting", GaugeName.KV_USAGE: "kv",
})
_HISTOGRAMS: Mapping[HistogramName, str] = MappingProxyType({
    HistogramName.TTFT_S: "ttft",
    HistogramName.ITL_S: "itl",
    HistogramName.REQUEST_TPOT_S: "tpot",
    HistogramName.PROMPT_LEN: "prompt",
    HistogramName.GENERATION_LEN: "generation",
    HistogramName.QUEUE_TIME_S: "queue",
    HistogramName.INFERENCE_TIME_S: "inference",
})
_KEYS = tuple(_HISTOGRAMS.values())
_BUCKETED = tuple(sorted(BUCKETED))  # the parser's order


def _readable(value: float) -> bool:
    return math.isfinite(value) and value >= 0


def pod_values(
    metrics: ReplicaMetrics, *, pod: str, time_s: float, model_name: str
) -> PodSample | None:
    """The sample `parse_exposition` makes of `metrics`' exposition text (model_name the one
    the emulator exports), or None when the text would hold a value the parser rejects."""
    counters_in, gauges_in, hists = metrics.totals(_KEYS)
    counters = {name: counters_in[key] for name, key in _COUNTERS.items()}
    gauges = {name: gauges_in[key] for name, key in _GAUGES.items()}
    histograms: dict[HistogramName, HistogramTotals] = {}
    cumulative: dict[HistogramName, tuple[float, ...]] = {}
    for name, key in _HISTOGRAMS.items():
        _, counts, total = hists[key]
        cumulative[name] = tuple(counts.tolist())
        histograms[name] = HistogramTotals(total, cumulative[name][-1])
    values = [*counters.values(), *gauges.values(),
              *(v for h in histograms.values() for v in (h.sum, h.count)),
              *(c for name in _BUCKETED for c in cumulative[name])]
    if not all(_readable(v) for v in values):
        return None
    # The parser keeps the max of the KV usage series from 0: -0.0 reads 0.0.
    gauges[GaugeName.KV_USAGE] = max(0.0, gauges[GaugeName.KV_USAGE])
    buckets = {name: CumulativeBuckets(tuple(hists[_HISTOGRAMS[name]][0].tolist()),
                                       cumulative[name]) for name in _BUCKETED}
    start = metrics.created_s
    capacity = metrics.kv_capacity_tokens
    return PodSample(
        pod=pod,
        time_s=time_s,
        status=SampleStatus.OK,
        counters=counters,
        histograms=histograms,
        gauges=gauges,
        process_start_s=start if math.isfinite(start) and start > 0 else None,
        buckets=buckets,
        kv_capacity_tokens=float(capacity) if capacity > 0 else None,
        model_names=(model_name,) if model_name else (),
    )
