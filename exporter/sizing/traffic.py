"""What a deployment's traffic looks like, measured per window and smoothed. percentiles.md §2, §4.

Each window gives, when enough requests finished, the prompt- and output-length CVs of its
token histograms (model.calibration.histogram.length_cv), the share of prompt tokens the prefix
cache served (the model's prefill runs on the rest: tuner points carry their window's share,
sizing uses the smoothed one), and the pods' KV capacity; in sidecar mode the 1 s sampler
adds the arrival CV (exporter.collector.arrival_sampler). What the model uses is smoothed over the
last SMOOTHING_WINDOWS windows, each weighted by its requests (CVs as the mean of their squares), so
that on steady traffic the published capacity barely moves between cycles. The output CV is
raised to what the KV cache held by running requests over the same windows implies where that
is higher (model.calibration.kv_context: the histogram misplaces point masses in its buckets;
the KV reading is summed over the windows' end reads, with the token means of the same windows).
A CV the config sets (`deployments[].model.*_cv`) is pinned: still measured and exported, never
used.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace
from enum import StrEnum

from exporter.collector.observations import DeploymentObservation
from exporter.collector.vllm_metrics import HistogramName
from exporter.config.values import DeploymentConfig
from model import ModelOptions, ServerConfig, Workload
from model.calibration.histogram import WindowHistogram, length_cv
from model.calibration.kv_context import KvContext, combined_output_cv, kv_output_cv2
from model.calibration.observation import model_hit_ratio, with_workload_cvs
from model.queueing.kv_limit import kv_batch_limit

SMOOTHING_WINDOWS = 10


class LengthCvKind(StrEnum):
    """Which request length a CV is about; exported label values."""

    PROMPT = "prompt"
    OUTPUT = "output"


_LENGTH_HISTOGRAMS = {
    LengthCvKind.PROMPT: HistogramName.PROMPT_LEN,
    LengthCvKind.OUTPUT: HistogramName.GENERATION_LEN,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class TrafficShape:
    """Smoothed measurements of one deployment's traffic; None: not measured (yet)."""

    input_length_cv: float | None = None
    output_length_cv: float | None = None
    arrival_cv: float | None = None
    cached_prompt_ratio: float | None = None  # prompt tokens served by the prefix cache
    kv_capacity_tokens: float | None = None  # per pod, the smallest
    # The output CV the running requests' KV implies (None: not read); output_length_cv is the
    # larger of it and the histogram's.
    kv_output_length_cv: float | None = None

    def length_cv(self, kind: LengthCvKind) -> float | None:
        """The smoothed CV of one request length."""
        return self.input_length_cv if kind is LengthCvKind.PROMPT else self.output_length_cv

    def measured_cvs(self) -> dict[str, float]:
        """The measured CVs and prefix-hit ratio by ModelOptions field name (those measured
        only)."""
        hit = self.cached_prompt_ratio
        values = {
            "input_length_cv": self.input_length_cv,
            "output_length_cv": self.output_length_cv,
            "arrival_cv": self.arrival_cv,
            "prefix_hit_ratio": None if hit is None else model_hit_ratio(hit),
        }
        return {name: value for name, value in values.items() if value is not None}


class _Smoothed:
    """Weighted mean of the last `size` values."""

    def __init__(self, size: int) -> None:
        self._entries: deque[tuple[float, float]] = deque(maxlen=size)

    def add(self, weight: float, value: float) -> None:
        if weight > 0 and math.isfinite(value):
            self._entries.append((weight, value))

    def value(self) -> float | None:
        total = sum(w for w, _ in self._entries)
        return sum(w * v for w, v in self._entries) / total if total > 0 else None


@dataclass(frozen=True, slots=True)
class _KvWindow:
    """One window's KV read at its end, and its prompt and output token histograms (their
    exact sums and counts give the means)."""

    context: KvContext
    prompts: WindowHistogram
    outputs: WindowHistogram


class TrafficTracker:
    """Smooths one deployment's traffic measurements over its last windows."""

    def __init__(self, windows: int = SMOOTHING_WINDOWS) -> None:
        self._cv2 = {kind: _Smoothed(windows) for kind in LengthCvKind}
        self._arrival_index = _Smoothed(windows)
        self._cached = _Smoothed(windows)
        self._kv_capacity: float | None = None
        self._kv: deque[_KvWindow] = deque(maxlen=windows)
        self.shape = TrafficShape()

    def update(
        self, obs: DeploymentObservation, dispersion: tuple[float, float] | None = None
    ) -> TrafficShape:
        """Add one window (and the sampler's (index of dispersion, requests) over it, if any);
        return the smoothed shape."""
        for kind, name in _LENGTH_HISTOGRAMS.items():
            window = obs.windows.get(name)
            cv = None if window is None else length_cv(window)
            if window is not None and cv is not None:
                self._cv2[kind].add(window.count, cv * cv)
        completed = obs.completion_rate_rps * obs.window_s
        if obs.cached_prompt_ratio is not None:
            self._cached.add(completed, obs.cached_prompt_ratio)
        if dispersion is not None:
            self._arrival_index.add(dispersion[1], dispersion[0])
        if obs.kv_capacity_tokens is not None:
            self._kv_capacity = obs.kv_capacity_tokens
        self._add_kv(obs)
        prompt = self._cv2[LengthCvKind.PROMPT].value()
        output = self._cv2[LengthCvKind.OUTPUT].value()
        arrival = self._arrival_index.value()
        kv_cv2 = self._kv_output_cv2()
        self.shape = TrafficShape(
            input_length_cv=None if prompt is None else math.sqrt(prompt),
            output_length_cv=combined_output_cv(
                None if output is None else math.sqrt(output), kv_cv2
            ),
            arrival_cv=None if arrival is None else math.sqrt(arrival),
            cached_prompt_ratio=self._cached.value(),
            kv_capacity_tokens=self._kv_capacity,
            kv_output_length_cv=None if kv_cv2 is None else math.sqrt(kv_cv2),
        )
        return self.shape

    def _add_kv(self, obs: DeploymentObservation) -> None:
        prompts = obs.windows.get(HistogramName.PROMPT_LEN)
        outputs = obs.windows.get(HistogramName.GENERATION_LEN)
        if obs.kv_context is None or prompts is None or outputs is None:
            return
        self._kv.append(_KvWindow(obs.kv_context, prompts, outputs))

    def _kv_output_cv2(self) -> float | None:
        """cv_m^2 from the KV held over the kept windows and their token means."""
        context = sum((entry.context for entry in self._kv), KvContext(0.0, 0.0))
        inputs = sum(e.prompts.count for e in self._kv)
        outputs = sum(e.outputs.count for e in self._kv)
        if inputs <= 0 or outputs <= 0:
            return None
        return kv_output_cv2(
            context,
            sum(e.prompts.sum for e in self._kv) / inputs,
            sum(e.outputs.sum for e in self._kv) / outputs,
        )


@dataclass(frozen=True, slots=True)
class ModelInputs:
    """What the model is evaluated with for one deployment: options and scheduler limits."""

    options: ModelOptions
    server: ServerConfig
    kv_batch_limit: int | None = None  # min(max_num_seqs, KV / context); None: KV unknown


def used_cvs(dep: DeploymentConfig, shape: TrafficShape) -> dict[str, float]:
    """The measured CVs (and prefix-hit ratio) the model uses: those the config does not
    pin."""
    return {k: v for k, v in shape.measured_cvs().items() if k not in dep.pinned_inputs}


def model_inputs(
    dep: DeploymentConfig, shape: TrafficShape, workload: Workload | None
) -> ModelInputs:
    """The deployment's options with its measured, unpinned CVs, and its batch limit lowered
    to what the KV cache holds at the mean request (model/queueing/kv_limit.py)."""
    options = with_workload_cvs(dep.model, used_cvs(dep, shape))
    server, limit = dep.server, None
    if shape.kv_capacity_tokens is not None and workload is not None:
        limit = kv_batch_limit(
            shape.kv_capacity_tokens,
            workload,
            server.max_batch_size,
            output_length_cv=options.output_length_cv if options.refined else 0.0,
        )
        server = replace(server, max_batch_size=limit)
    return ModelInputs(options, server, limit)
