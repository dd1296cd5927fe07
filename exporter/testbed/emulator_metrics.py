"""vLLM's /metrics exposition for one emulated replica: the names, types, labels (`model_name`,
`engine`), HELP texts and default histogram buckets of vLLM 0.32/0.33. Ecosystem §1.1-1.3;
collector-spec §4.

`ReplicaMetrics` is a prometheus-client collector: the simulation thread feeds it iteration
records (`apply`) and gauges; scrapes read a copy taken under its own lock, so a scrape never
waits for a simulation step. The local prefix cache is counted from each
request's cached prompt tokens; families vLLM has but the emulator does not model (external and
multi-modal caches, FLOP estimates, LoRA) are exported at zero so the exposition has the same
family set as the real one.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Mapping, Sequence
from enum import StrEnum
from types import MappingProxyType

import numpy as np
from numpy.typing import NDArray
from prometheus_client.metrics_core import Metric

from model.calibration.histogram import WindowHistogram
from model.simulation.bucket_kernel import bucket_add
from model.simulation.records import WindowRecords
from model.simulation.replica import IterationRecord
from model.simulation.request_table import RequestTable

FloatArray = NDArray[np.float64]
_NO_WEIGHTS = np.empty(0)

TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                  5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                             40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1.0,) + tuple(float(2**k) for k in range(3, 15))
PARAMS_N_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0)
PREEMPTION_BUCKETS = (1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0)
DEFAULT_BLOCK_SIZE = 16
ENGINE = "0"
PROCESS_START_METRIC = "process_start_time_seconds"


def token_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's 1-2-5 series of token-count bounds, capped at max_model_len."""
    out: list[float] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_model_len:
                return tuple(out)
            out.append(float(m * scale))
        scale *= 10


def length_histogram(tokens: NDArray[np.int64], max_model_len: int) -> WindowHistogram:
    """The token-length histogram these requests leave in vLLM's exposition (`token_buckets`,
    a bound counts values <= it, exact sum and count): what a collector reads for one window."""
    bounds = np.asarray(token_buckets(max_model_len))
    buckets = np.searchsorted(bounds, tokens, side="left")
    counts = np.bincount(buckets, minlength=bounds.size + 1).astype(np.float64)
    return WindowHistogram(
        bounds=bounds, counts=counts, sum=float(np.sum(tokens)), count=float(np.size(tokens))
    )


def latency_histogram(
    values_s: FloatArray, bounds_s: tuple[float, ...], weights: FloatArray | None = None
) -> WindowHistogram:
    """The latency histogram (s) these observations leave in vLLM's exposition (a bound counts
    values <= it; `weights`: how many observations each value stands for, as the token count of
    an iteration's gap); a value that is not finite (no gap yet) is left out."""
    bounds = np.asarray(bounds_s)
    kept = np.isfinite(values_s)
    values_s = values_s[kept]
    w = np.ones_like(values_s) if weights is None else weights[kept]
    buckets = np.searchsorted(bounds, values_s, side="left")
    counts = np.bincount(buckets, weights=w, minlength=bounds.size + 1).astype(np.float64)
    return WindowHistogram(
        bounds=bounds, counts=counts, sum=float(np.dot(values_s, w)), count=float(w.sum())
    )


class FinishedReason(StrEnum):
    """vLLM's `finished_reason` label values; emulated requests stop at max_tokens (length)."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"
    REPETITION = "repetition"


class _Histogram:
    """Bucket counts (last one +Inf) and sum of one histogram series."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = np.asarray(bounds)
        self.counts = np.zeros(len(bounds) + 1)
        self.total = 0.0

    def observe(self, values: FloatArray, weights: FloatArray | None = None) -> None:
        if values.size == 0:
            return
        # `le` buckets: a value counts in the first bound >= it.
        bucket_add(self.bounds, values, _NO_WEIGHTS if weights is None else weights,
                   self.counts)
        self.total += float(np.dot(values, weights) if weights is not None else values.sum())

    def copy(self) -> _Histogram:
        out = _Histogram(())
        out.bounds, out.counts, out.total = self.bounds, self.counts.copy(), self.total
        return out


# (name, HELP) in the order of vLLM's exposition.
_COUNTERS_ZERO = (
    ("vllm:estimated_flops_per_gpu", "Estimated number of floating point operations per GPU (for "
     "Model Flops Utilization calculations)."),
    ("vllm:estimated_read_bytes_per_gpu", "Estimated number of bytes read from memory per GPU (for "
     "Model Flops Utilization calculations)."),
    ("vllm:estimated_write_bytes_per_gpu", "Estimated number of bytes written to memory per GPU "
     "(for Model Flops Utilization calculations)."),
)
_CACHE_COUNTERS = (
    ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."),
    ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."),
    ("vllm:external_prefix_cache_queries", "External prefix cache queries from KV connector "
     "cross-instance cache sharing, in terms of number of queried tokens."),
    ("vllm:external_prefix_cache_hits", "External prefix cache hits from KV connector "
     "cross-instance cache sharing, in terms of number of cached tokens."),
    ("vllm:mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items."),
    ("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items."),
)
_CACHED_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
_PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
_REJECTION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
_SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
# Histograms: key -> (name, HELP, bounds kind).
_HISTOGRAMS = (
    ("prompt", "vllm:request_prompt_tokens", "Number of prefill tokens processed.", "tokens"),
    ("generation", "vllm:request_generation_tokens", "Number of generation tokens processed.",
     "tokens"),
    ("iteration", "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
     "iteration"),
    ("max_gen", "vllm:request_max_num_generation_tokens",
     "Histogram of maximum number of requested generation tokens.", "tokens"),
    ("params_n", "vllm:request_params_n", "Histogram of the n request parameter.", "n"),
    ("max_tokens", "vllm:request_params_max_tokens",
     "Histogram of the max_tokens request parameter.", "tokens"),
    ("ttft", "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
     "ttft"),
    ("itl", "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
     "itl"),
    ("tpot", "vllm:request_time_per_output_token_seconds",
     "Histogram of time_per_output_token_seconds per request.", "itl"),
    ("e2e", "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
     "latency"),
    ("queue", "vllm:request_queue_time_seconds",
     "Histogram of time spent in WAITING phase for request.", "latency"),
    ("inference", "vllm:request_inference_time_seconds",
     "Histogram of time spent in RUNNING phase for request.", "latency"),
    ("prefill", "vllm:request_prefill_time_seconds",
     "Histogram of time spent in PREFILL phase for request.", "latency"),
    ("decode", "vllm:request_decode_time_seconds",
     "Histogram of time spent in DECODE phase for request.", "latency"),
    ("preemptions", "vllm:request_num_preemptions",
     "Histogram of the number of times a request was preempted.", "preemptions"),
    ("kv_computed", "vllm:request_prefill_kv_computed_tokens",
     "Histogram of new KV tokens computed during prefill (excluding cached tokens).", "tokens"),
)
# vLLM's CacheConfig fields as exported by cache_config_info (0.32); sizes are filled in.
_CACHE_CONFIG_DEFAULTS: Mapping[str, str] = MappingProxyType({
    "_block_size_resolved": "True", "cache_dtype": "auto", "cache_hit_alignment_tokens": "None",
    "enable_mamba_shared_prefix_checkpoint": "False", "enable_prefix_caching": "False",
    "gpu_memory_utilization": "0.9", "hash_block_size": "None", "is_attention_free": "False",
    "kv_cache_dtype_skip_layers": "[]", "kv_cache_layout": "None",
    "kv_offloading_backend": "native", "kv_offloading_size": "None",
    "kv_sharing_fast_prefill": "False", "mamba_block_size": "None",
    "mamba_cache_dtype": "auto", "mamba_cache_mode": "none", "mamba_page_size_padded": "None",
    "mamba_ssm_cache_dtype": "auto", "num_cpu_blocks": "None", "num_gpu_blocks_override": "None",
    "prefix_cache_retention_interval": "0", "prefix_caching_hash_algo": "sha256",
    "prefix_match_unit": "None", "replayssm_buffer_len": "16", "skip_page_size_padded": "None",
    "sliding_window": "None", "swa_bounded_replay": "True", "use_kda_recoverssm": "False",
    "use_replayssm": "False", "user_specified_block_size": "False",
})
_HELP: Mapping[str, str] = MappingProxyType({
    "vllm:num_requests_running": "Number of requests in model execution batches.",
    "vllm:num_requests_waiting": "Number of requests waiting to be processed.",
    "vllm:num_requests_waiting_by_reason": "Number of waiting requests by reason. Reason labels: "
    "'capacity' = waiting for scheduling capacity; 'deferred' = deferred by transient constraints "
    "(LoRA budget, KV transfer, blocked status). Sum of all reasons equals "
    "vllm:num_requests_waiting.",
    "vllm:engine_sleep_state": "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 "
    "means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep "
    "level 2.",
    "vllm:kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
    "vllm:num_preemptions": "Cumulative number of preemption from the engine.",
    "vllm:prompt_tokens": "Number of prefill tokens processed.",
    "vllm:prompt_tokens_by_source": "Number of prompt tokens by source.",
    "vllm:prompt_tokens_cached": "Number of cached prompt tokens (local + external).",
    "vllm:prompt_tokens_cached_by_source": "Prefix-cache hit tokens by the cache tier that "
    "supplied them: device (local HBM), host (offloaded to DRAM), disk, p2p (transferred from "
    "another vLLM instance) or external_unspecified. Counted at admission; sums to "
    "vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
    "vllm:generation_tokens": "Number of generation tokens processed.",
    "vllm:request_success": "Count of successfully processed requests.",
    "vllm:admission_rejections": "Number of admission attempts rejected by a queue limit, by "
    "reason.",
    "vllm:cache_config_info": "Information of the LLMEngine CacheConfig",
    PROCESS_START_METRIC: "Start time of the process since unix epoch in seconds.",
})
_KV_BYTES_PER_TOKEN = 131072  # Llama-3.1-8B in BF16 (paper §VI): only fills a label


class ReplicaMetrics:
    """Cumulative vLLM metrics of one emulated replica (a prometheus-client collector)."""

    def __init__(
        self,
        *,
        model_name: str,
        max_model_len: int,
        kv_capacity_tokens: int,
        created_s: float,
        block_size: int = DEFAULT_BLOCK_SIZE,
    ) -> None:
        self._labels = {"engine": ENGINE, "model_name": model_name}
        self._created_s = created_s
        self._lock = threading.Lock()
        self._counters = {"prompt": 0.0, "generation": 0.0, "preemptions": 0.0, "success": 0.0,
                          "rejected": 0.0, "cached": 0.0}
        self._gauges = {"running": 0.0, "waiting": 0.0, "kv": 0.0}
        bounds = {
            "tokens": token_buckets(max_model_len), "iteration": ITERATION_TOKEN_BUCKETS,
            "n": PARAMS_N_BUCKETS, "ttft": TTFT_BUCKETS_S, "itl": ITL_BUCKETS_S,
            "latency": REQUEST_LATENCY_BUCKETS_S, "preemptions": PREEMPTION_BUCKETS,
        }
        self._hists = {key: _Histogram(bounds[kind]) for key, _, _, kind in _HISTOGRAMS}
        blocks = kv_capacity_tokens // block_size
        self._cache_labels = dict(_CACHE_CONFIG_DEFAULTS) | {
            "block_size": str(block_size),
            "effective_attention_block_size": str(block_size),
            "engine": ENGINE,
            "kv_cache_max_concurrency": str(round(blocks * block_size / max_model_len, 2)),
            "kv_cache_memory_bytes": str(blocks * block_size * _KV_BYTES_PER_TOKEN),
            "kv_cache_size_tokens": str(blocks * block_size),
            "num_gpu_blocks": str(blocks),
        }

    def apply(self, record: IterationRecord, requests: RequestTable) -> None:
        """Account one iteration record; `requests` is read for the requests it names."""
        self.apply_all((record,), requests)

    def apply_all(self, records: Sequence[IterationRecord], requests: RequestTable) -> None:
        """Account several iteration records of this replica at once (the same counts as one
        by one, each histogram observed once: a replay applies a window's records)."""
        if not records:
            return
        cols = WindowRecords.of(records)
        obs: dict[str, tuple[FloatArray, FloatArray | None]] = {
            "iteration": (cols.tokens_per_iteration.astype(np.float64),
                          cols.iterations.astype(np.float64)),
            "itl": (cols.gap_s, cols.gap_weight.astype(np.float64)),
        }
        first = cols.first_token_ids
        prompt = cached = 0.0
        if first.size:
            obs["ttft"] = (requests.first_token_s[first] - requests.arrival_s[first], None)
            prompt = float(requests.input_tokens[first].sum())
            cached = float(requests.cached_tokens[first].sum())
        done = cols.finished_ids
        if done.size:
            n_in = requests.input_tokens[done].astype(np.float64)
            n_out = requests.output_tokens[done].astype(np.float64)
            arrival, sched = requests.arrival_s[done], requests.first_sched_s[done]
            first_s, finish = requests.first_token_s[done], requests.finish_s[done]
            decode = finish - first_s
            # vLLM observes 0 when only one token was generated.
            tpot = np.divide(decode, n_out - 1, out=np.zeros_like(decode), where=n_out > 1)
            for key, values in (
                ("prompt", n_in), ("generation", n_out), ("max_gen", n_out),
                ("params_n", np.ones_like(n_in)), ("max_tokens", n_out),
                ("tpot", tpot), ("e2e", finish - arrival), ("queue", sched - arrival),
                ("inference", finish - sched), ("prefill", first_s - sched), ("decode", decode),
                ("preemptions", requests.preemptions[done].astype(np.float64)),
                ("kv_computed", n_in - requests.cached_tokens[done]),
            ):
                obs[key] = (values, None)
        with self._lock:
            self._counters["generation"] += int(cols.emitted_tokens.sum())
            self._counters["preemptions"] += int(cols.preemptions.sum())
            self._counters["prompt"] += prompt
            self._counters["cached"] += cached
            self._counters["success"] += done.size
            for key, (values, weights) in obs.items():
                self._hists[key].observe(values, weights)

    def add_rejections(self, count: int) -> None:
        """Count arrivals refused by the queue limit."""
        with self._lock:
            self._counters["rejected"] += count

    def set_gauges(self, *, running: int, waiting: int, kv_usage_ratio: float) -> None:
        """Current batch occupancy, queue length and KV-cache usage (0-1)."""
        with self._lock:
            self._gauges.update(running=float(running), waiting=float(waiting), kv=kv_usage_ratio)

    def totals(self, keys: Sequence[str]) -> tuple[dict[str, float], dict[str, float],
                                                   dict[str, tuple[FloatArray, FloatArray, float]]]:
        """Copies of the counters, the gauges and the histograms named (`_HISTOGRAMS`' keys:
        bounds, cumulative counts with +Inf last, sum): the values `collect` renders, for a
        reader that takes them without the text (exporter/replay/pod_values.py)."""
        with self._lock:
            hists = {k: (self._hists[k].bounds, np.cumsum(self._hists[k].counts),
                         self._hists[k].total) for k in keys}
            return dict(self._counters), dict(self._gauges), hists

    @property
    def created_s(self) -> float:
        """The process start time exported (s)."""
        return self._created_s

    @property
    def kv_capacity_tokens(self) -> int:
        """num_gpu_blocks x block_size as cache_config_info exports them."""
        return int(self._cache_labels["num_gpu_blocks"]) * int(self._cache_labels["block_size"])

    def describe(self) -> Iterator[Metric]:
        return self.collect()

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            counters = dict(self._counters)
            gauges = dict(self._gauges)
            hists = {key: h.copy() for key, h in self._hists.items()}
        lab = self._labels
        waiting, prompt, cached = gauges["waiting"], counters["prompt"], counters["cached"]
        for name, doc in _COUNTERS_ZERO:
            yield self._counter(name, doc, [(lab, 0.0)])
        yield self._gauge("vllm:num_requests_running", [(lab, gauges["running"])])
        yield self._gauge("vllm:num_requests_waiting", [(lab, waiting)])
        yield self._gauge(
            "vllm:num_requests_waiting_by_reason",
            [(lab | {"reason": "capacity"}, waiting), (lab | {"reason": "deferred"}, 0.0)],
        )
        yield self._gauge(
            "vllm:engine_sleep_state",
            [(lab | {"sleep_state": s}, 1.0 if s == "awake" else 0.0) for s in _SLEEP_STATES],
        )
        yield self._gauge("vllm:kv_cache_usage_perc", [(lab, gauges["kv"])])
        # Prefix caching counted at the first token, in tokens: every prompt token is looked up,
        # the cached prefix hits (the device tier).
        local = {"vllm:prefix_cache_queries": prompt, "vllm:prefix_cache_hits": cached}
        for name, doc in _CACHE_COUNTERS:
            yield self._counter(name, doc, [(lab, local.get(name, 0.0))])
        yield self._counter("vllm:num_preemptions", _HELP["vllm:num_preemptions"],
                            [(lab, counters["preemptions"])])
        yield self._counter("vllm:prompt_tokens", _HELP["vllm:prompt_tokens"], [(lab, prompt)])
        yield self._counter(
            "vllm:prompt_tokens_by_source", _HELP["vllm:prompt_tokens_by_source"],
            [(lab | {"source": s},
              {"local_compute": prompt - cached, "local_cache_hit": cached}.get(s, 0.0))
             for s in _PROMPT_SOURCES],
        )
        yield self._counter("vllm:prompt_tokens_cached", _HELP["vllm:prompt_tokens_cached"],
                            [(lab, cached)])
        yield self._counter(
            "vllm:prompt_tokens_cached_by_source", _HELP["vllm:prompt_tokens_cached_by_source"],
            [(lab | {"source": s}, cached if s == "device" else 0.0) for s in _CACHED_SOURCES],
        )
        yield self._counter("vllm:generation_tokens", _HELP["vllm:generation_tokens"],
                            [(lab, counters["generation"])])
        success = counters["success"]
        yield self._counter(
            "vllm:request_success", _HELP["vllm:request_success"],
            [(lab | {"finished_reason": r.value}, success if r is FinishedReason.LENGTH else 0.0)
             for r in FinishedReason],
        )
        model_only = {"model_name": lab["model_name"]}  # vLLM's frontend series has no engine
        yield self._counter(
            "vllm:admission_rejections", _HELP["vllm:admission_rejections"],
            [(model_only | {"reason": r},
              counters["rejected"] if r == "max_num_queued_reqs" else 0.0)
             for r in _REJECTION_REASONS],
        )
        for key, name, doc, _ in _HISTOGRAMS:
            yield self._histogram(name, doc, hists[key])
        yield self._gauge("vllm:cache_config_info", [(self._cache_labels, 1.0)])
        yield self._gauge(PROCESS_START_METRIC, [({}, self._created_s)])

    def _counter(self, name: str, doc: str, series: list[tuple[dict[str, str], float]]) -> Metric:
        metric = Metric(name, doc, "counter")
        for labels, value in series:
            metric.add_sample(name + "_total", labels, value)
        for labels, _ in series:
            metric.add_sample(name + "_created", labels, self._created_s)
        return metric

    @staticmethod
    def _gauge(name: str, series: list[tuple[dict[str, str], float]]) -> Metric:
        metric = Metric(name, _HELP[name], "gauge")
        for labels, value in series:
            metric.add_sample(name, labels, value)
        return metric

    def _histogram(self, name: str, doc: str, hist: _Histogram) -> Metric:
        metric = Metric(name, doc, "histogram")
        cumulative = np.cumsum(hist.counts)
        bounds = [*hist.bounds.tolist(), float("inf")]
        for bound, count in zip(bounds, cumulative.tolist(), strict=True):
            labels = self._labels | {"le": "+Inf" if math.isinf(bound) else repr(bound)}
            metric.add_sample(name + "_bucket", labels, count)
        metric.add_sample(name + "_count", self._labels, float(cumulative[-1]))
        metric.add_sample(name + "_sum", self._labels, hist.total)
        metric.add_sample(name + "_created", self._labels, self._created_s)
        return metric
