"""vLLM /metrics exposition -> one frozen per-pod sample. collector-spec §4, ecosystem §1.1-1.4.

A `PodSample` holds, for one pod at one instant, the cumulative counters, the histogram
`_sum`/`_count` totals and the gauges the observation builder needs, summed over the `engine`
and `finished_reason` labels (KV-cache usage: the max) of the chosen `model_name`. Old and new
vLLM metric names are accepted: per signal the first candidate present is read, newest first
(ecosystem §1.4), and the legacy names used are noted. The direct scrape parses exposition
text here; the Prometheus source feeds raw series to `sample_from_series()`, so both end in
the same type.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType

from exporter.base.errors import ScrapeError
from exporter.collector.exposition_text import PARSER_ERRORS, parse_families
from exporter.collector.vllm_buckets import BUCKET_SUFFIX, BucketAccumulator, CumulativeBuckets

logger = logging.getLogger(__name__)

MODEL_LABEL = "model_name"
PROCESS_START_METRIC = "process_start_time_seconds"


class CounterName(StrEnum):
    """Cumulative vLLM counters, summed over engines and `finished_reason`."""

    REQUEST_SUCCESS = "request_success"
    PROMPT_TOKENS = "prompt_tokens"
    GENERATION_TOKENS = "generation_tokens"
    PREEMPTIONS = "num_preemptions"
    PROMPT_TOKENS_CACHED = "prompt_tokens_cached"
    PREFIX_CACHE_HITS = "prefix_cache_hits"
    PREFIX_CACHE_QUERIES = "prefix_cache_queries"


class HistogramName(StrEnum):
    """vLLM histograms read as (`_sum`, `_count`) totals; latencies in seconds."""

    TTFT_S = "time_to_first_token"
    ITL_S = "inter_token_latency"
    REQUEST_TPOT_S = "request_time_per_output_token"
    PROMPT_LEN = "request_prompt_tokens"
    GENERATION_LEN = "request_generation_tokens"
    QUEUE_TIME_S = "request_queue_time"
    INFERENCE_TIME_S = "request_inference_time"


class GaugeName(StrEnum):
    """Instantaneous vLLM gauges; running and waiting summed over engines, KV usage the max."""

    RUNNING = "num_requests_running"
    WAITING = "num_requests_waiting"
    KV_USAGE = "kv_cache_usage"


class SampleStatus(StrEnum):
    """Whether a pod's exposition gave a usable sample; values are exported label values."""

    OK = "ok"
    NO_VLLM_METRICS = "no_vllm_metrics"
    MODEL_NOT_FOUND = "model_not_found"
    INCOMPLETE = "incomplete"


# Candidate exposed names per logical signal, newest first (ecosystem §1.4): the first is the
# current name, any other a legacy one. Counter samples
# always carry `_total` whatever the vLLM version (ecosystem §1.1).
COUNTER_SOURCES: Mapping[CounterName, tuple[str, ...]] = MappingProxyType(
    {
        CounterName.REQUEST_SUCCESS: ("vllm:request_success_total",),
        CounterName.PROMPT_TOKENS: ("vllm:prompt_tokens_total",),
        CounterName.GENERATION_TOKENS: ("vllm:generation_tokens_total",),
        CounterName.PREEMPTIONS: ("vllm:num_preemptions_total",),
        CounterName.PROMPT_TOKENS_CACHED: ("vllm:prompt_tokens_cached_total",),
        # The legacy names counted blocks, the new ones tokens: only their ratio is used.
        CounterName.PREFIX_CACHE_HITS: (
            "vllm:prefix_cache_hits_total",
            "vllm:gpu_prefix_cache_hits_total",
        ),
        CounterName.PREFIX_CACHE_QUERIES: (
            "vllm:prefix_cache_queries_total",
            "vllm:gpu_prefix_cache_queries_total",
        ),
    }
)
HISTOGRAM_SOURCES: Mapping[HistogramName, tuple[str, ...]] = MappingProxyType(
    {
        HistogramName.TTFT_S: ("vllm:time_to_first_token_seconds",),
        HistogramName.ITL_S: (
            "vllm:inter_token_latency_seconds",
            "vllm:time_per_output_token_seconds",
        ),
        HistogramName.REQUEST_TPOT_S: ("vllm:request_time_per_output_token_seconds",),
        HistogramName.PROMPT_LEN: ("vllm:request_prompt_tokens",),
        HistogramName.GENERATION_LEN: ("vllm:request_generation_tokens",),
        HistogramName.QUEUE_TIME_S: ("vllm:request_queue_time_seconds",),
        HistogramName.INFERENCE_TIME_S: ("vllm:request_inference_time_seconds",),
    }
)
GAUGE_SOURCES: Mapping[GaugeName, tuple[str, ...]] = MappingProxyType(
    {
        GaugeName.RUNNING: ("vllm:num_requests_running",),
        GaugeName.WAITING: ("vllm:num_requests_waiting",),
        GaugeName.KV_USAGE: ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    }
)
REQUIRED_COUNTERS = (CounterName.REQUEST_SUCCESS,)
# Histograms whose buckets are read too (percentiles.md §2): the token lengths give the length
# spread, the latencies SLO attainment at a bucket bound.
BUCKETED = frozenset(
    {
        HistogramName.PROMPT_LEN,
        HistogramName.GENERATION_LEN,
        HistogramName.TTFT_S,
        HistogramName.ITL_S,
        HistogramName.REQUEST_TPOT_S,
    }
)
# vLLM's KV-cache configuration: a gauge fixed at 1 whose labels are CacheConfig's fields
# (ecosystem §1.1); it has no model_name label. Capacity = num_gpu_blocks x block_size.
CACHE_CONFIG_METRIC = "vllm:cache_config_info"


def wanted_sample_names(*, escaped: bool = False) -> frozenset[str]:
    """Every sample name this module reads; with `escaped`, also their '_' spellings."""
    names = {PROCESS_START_METRIC, CACHE_CONFIG_METRIC}
    for candidates in COUNTER_SOURCES.values():
        names.update(candidates)
    for candidates in GAUGE_SOURCES.values():
        names.update(candidates)
    for histogram, candidates in HISTOGRAM_SOURCES.items():
        for base in candidates:
            names.update((base + "_sum", base + "_count"))
            if histogram in BUCKETED:
                names.add(base + BUCKET_SUFFIX)
    if escaped:
        names.update([escaped_name(n) for n in names])
    return frozenset(names)


def escaped_name(name: str) -> str:
    """`name` as prometheus-client >= 0.2x writes it under OpenMetrics "underscores" escaping."""
    return name.replace(":", "_")


# Prometheus negotiates OpenMetrics, and prometheus-client then writes sample names with ':'
# replaced by '_' (seen with 0.26: `vllm_num_requests_running`), so a Prometheus may hold either
# spelling. Both are read; the canonical one wins when a pod has both.
_ESCAPED: Mapping[str, str] = MappingProxyType(
    {escaped_name(n): n for n in wanted_sample_names() if escaped_name(n) != n}
)
_WANTED = wanted_sample_names(escaped=True)
# Which family types may carry a sample: the parser is lax, so a `_sum` of a gauge family or
# a counter declared as a histogram is rejected, while an untyped family is accepted.
_EXPECTED_TYPE: Mapping[str, str] = MappingProxyType(
    {
        **{n: "counter" for c in COUNTER_SOURCES.values() for n in c},
        **{n: "gauge" for c in GAUGE_SOURCES.values() for n in c},
        **{
            base + suffix: "histogram"
            for c in HISTOGRAM_SOURCES.values()
            for base in c
            for suffix in ("_sum", "_count", BUCKET_SUFFIX)
        },
        PROCESS_START_METRIC: "gauge",
        CACHE_CONFIG_METRIC: "gauge",
    }
)
_LAX_TYPES = frozenset({"unknown", "untyped"})


@dataclass(frozen=True, slots=True)
class HistogramTotals:
    """Cumulative `_sum` (the histogram's unit) and `_count` (observations) of one histogram."""

    sum: float
    count: float


@dataclass(frozen=True, slots=True)
class RawSeries:
    """One exposed sample: name, labels, value (and the family type when known)."""

    name: str
    labels: Mapping[str, str]
    value: float
    family_type: str = "unknown"


@dataclass(frozen=True, slots=True, kw_only=True)
class PodSample:
    """One pod's cumulative vLLM totals and gauges at `time_s` (s, the source's time base)."""

    pod: str
    time_s: float
    status: SampleStatus
    counters: Mapping[CounterName, float] = field(default_factory=dict)
    histograms: Mapping[HistogramName, HistogramTotals] = field(default_factory=dict)
    gauges: Mapping[GaugeName, float] = field(default_factory=dict)
    process_start_s: float | None = None
    buckets: Mapping[HistogramName, CumulativeBuckets] = field(default_factory=dict)
    bad_buckets: tuple[HistogramName, ...] = ()  # bucket sets that failed the checks
    kv_capacity_tokens: float | None = None  # num_gpu_blocks x block_size, summed over engines
    model_names: tuple[str, ...] = ()
    legacy_names: tuple[str, ...] = ()
    skipped_lines: int = 0
    rejected_samples: int = 0

    def __post_init__(self) -> None:
        # Read-only views: a frozen sample must not change under the observation builder.
        object.__setattr__(self, "counters", MappingProxyType(dict(self.counters)))
        object.__setattr__(self, "histograms", MappingProxyType(dict(self.histograms)))
        object.__setattr__(self, "gauges", MappingProxyType(dict(self.gauges)))
        object.__setattr__(self, "buckets", MappingProxyType(dict(self.buckets)))

    @property
    def ok(self) -> bool:
        """True when the sample can enter an observation."""
        return self.status is SampleStatus.OK


def parse_exposition(
    text: str, *, pod: str, time_s: float, model_name: str | None = None
) -> PodSample:
    """Exposition text -> PodSample; raises ScrapeError (reason parse) if nothing parses."""
    try:
        families, skipped = parse_families(text)
        series = [
            RawSeries(s.name, s.labels, s.value, family.type)
            for family in families
            for s in family.samples
            if s.name in _WANTED
        ]
        sample = sample_from_series(series, pod=pod, time_s=time_s, model_name=model_name)
    except PARSER_ERRORS as exc:
        raise ScrapeError(pod, f"unparseable exposition: {exc}") from exc
    if skipped:
        logger.debug("%s: skipped %d unparseable exposition lines", pod, skipped)
        sample = replace(sample, skipped_lines=skipped)
    return sample


def sample_from_series(
    series: Iterable[RawSeries], *, pod: str, time_s: float, model_name: str | None = None
) -> PodSample:
    """Raw series of one pod -> PodSample: alias choice, model filter, type and value checks."""
    values: dict[str, float] = {}
    kv_max: dict[str, float] = {}
    models: set[str] = set()
    rejected = 0
    seen_vllm = False
    matched = False
    process_start: float | None = None
    kv_capacity: float | None = None
    bucket_acc = BucketAccumulator()
    wanted = [raw for raw in series if raw.name in _WANTED]
    canonical = {raw.name for raw in wanted if raw.name not in _ESCAPED}
    seen: set[tuple[str, frozenset[tuple[str, str]]]] = set()
    for raw in wanted:
        if raw.name in _ESCAPED:
            if _ESCAPED[raw.name] in canonical:
                continue  # the pod has the canonical spelling too: do not count it twice
            raw = replace(raw, name=_ESCAPED[raw.name])
        key = (raw.name, frozenset((k, v) for k, v in raw.labels.items() if k != "__name__"))
        if key in seen or not _type_ok(raw):
            rejected += 1  # a repeated series would be summed twice; a mistyped one is junk
            continue
        seen.add(key)
        if raw.name == PROCESS_START_METRIC:
            if math.isfinite(raw.value) and raw.value > 0:
                process_start = raw.value
            continue
        if raw.name == CACHE_CONFIG_METRIC:
            tokens = _kv_capacity_tokens(raw.labels)
            if tokens is not None:
                kv_capacity = (kv_capacity or 0.0) + tokens
            continue
        seen_vllm = True
        model = raw.labels.get(MODEL_LABEL, "")
        models.add(model)
        if model_name is not None and model != model_name:
            continue
        matched = True
        if not math.isfinite(raw.value) or raw.value < 0:
            rejected += 1  # NaN/Inf/negative: the signal is absent, never read as a number
            continue
        if raw.name in _KV_NAMES:
            kv_max[raw.name] = max(kv_max.get(raw.name, 0.0), raw.value)
        elif raw.name.endswith(BUCKET_SUFFIX):
            bucket_acc.add(raw.name.removesuffix(BUCKET_SUFFIX), raw.labels, raw.value)
        else:
            values[raw.name] = values.get(raw.name, 0.0) + raw.value
    values.update(kv_max)
    model_names = tuple(sorted(m for m in models if m))
    counters, histograms, gauges, legacy = _select_aliases(values)
    buckets, bad_buckets = _select_buckets(bucket_acc, legacy)
    if not seen_vllm:
        status = SampleStatus.NO_VLLM_METRICS
    elif not matched:
        status = SampleStatus.MODEL_NOT_FOUND
    elif any(c not in counters for c in REQUIRED_COUNTERS):
        status = SampleStatus.INCOMPLETE
    else:
        status = SampleStatus.OK
    if status is SampleStatus.MODEL_NOT_FOUND:
        # Debug here: observe_deployment() logs the one warning per deployment and cycle.
        logger.debug(
            "%s: no vLLM series for model_name=%r; exposed model names: %s",
            pod,
            model_name,
            ", ".join(model_names) or "(none)",
        )
    return PodSample(
        pod=pod,
        time_s=time_s,
        status=status,
        counters=counters,
        histograms=histograms,
        gauges=gauges,
        process_start_s=process_start,
        buckets=buckets,
        bad_buckets=bad_buckets,
        kv_capacity_tokens=kv_capacity,
        model_names=model_names,
        legacy_names=legacy,
        rejected_samples=rejected,
    )


_KV_NAMES = frozenset(GAUGE_SOURCES[GaugeName.KV_USAGE])


def _type_ok(raw: RawSeries) -> bool:
    return raw.family_type in _LAX_TYPES or raw.family_type == _EXPECTED_TYPE[raw.name]


def _select_aliases(
    values: Mapping[str, float],
) -> tuple[
    dict[CounterName, float],
    dict[HistogramName, HistogramTotals],
    dict[GaugeName, float],
    tuple[str, ...],
]:
    """Pick, per signal, the first candidate name present; note the legacy names used."""
    legacy: list[str] = []
    counters: dict[CounterName, float] = {}
    for counter, candidates in COUNTER_SOURCES.items():
        for i, name in enumerate(candidates):
            if name in values:
                counters[counter] = values[name]
                legacy.extend([name] if i else [])
                break
    gauges: dict[GaugeName, float] = {}
    for gauge, candidates in GAUGE_SOURCES.items():
        for i, name in enumerate(candidates):
            if name in values:
                gauges[gauge] = values[name]
                legacy.extend([name] if i else [])
                break
    histograms: dict[HistogramName, HistogramTotals] = {}
    for histogram, candidates in HISTOGRAM_SOURCES.items():
        for i, base in enumerate(candidates):
            # A histogram is used only whole: a `_sum` without its `_count` is no mean.
            if base + "_sum" in values and base + "_count" in values:
                histograms[histogram] = HistogramTotals(
                    values[base + "_sum"], values[base + "_count"]
                )
                legacy.extend([base] if i else [])
                break
    return counters, histograms, gauges, tuple(legacy)


def _kv_capacity_tokens(labels: Mapping[str, str]) -> float | None:
    """num_gpu_blocks x block_size from cache_config_info's labels; None unless both are
    positive integers (vLLM writes "None" before the KV cache is profiled)."""
    try:
        blocks, size = int(labels["num_gpu_blocks"]), int(labels["block_size"])
    except (KeyError, ValueError):
        return None
    return float(blocks * size) if blocks > 0 and size > 0 else None


def _select_buckets(
    acc: BucketAccumulator, legacy: Iterable[str]
) -> tuple[dict[HistogramName, CumulativeBuckets], tuple[HistogramName, ...]]:
    """Buckets of the histogram names `_select_aliases` chose (the current name unless a
    legacy one was used), and the histograms whose buckets failed the checks."""
    summed, broken = acc.result()
    used_legacy = set(legacy)
    buckets: dict[HistogramName, CumulativeBuckets] = {}
    bad: list[HistogramName] = []
    for histogram in sorted(BUCKETED):
        candidates = HISTOGRAM_SOURCES[histogram]
        base = next((b for b in candidates if b in used_legacy), candidates[0])
        if base in broken:
            bad.append(histogram)
        elif base in summed:
            buckets[histogram] = summed[base]
    return buckets, tuple(bad)
