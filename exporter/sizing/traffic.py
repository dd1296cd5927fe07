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
The request shape sized for is kept with them: the completion-weighted mean token lengths of the
last SHAPE_WINDOWS shapes (a shorter span: a longer mean lags a change of shape).
A CV the config sets (`deployments[].model.*_cv`) is pinned: still measured and exported, never
used.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace
from enum import StrEnum

import numpy as np

from exporter.collector.observations import DeploymentObservation
from exporter.collector.vllm_metrics import HistogramName
from exporter.config.values import DeploymentConfig
from model import ModelOptions, ServerConfig, Workload
from model.calibration.histogram import WindowHistogram, length_cv
from model.calibration.kv_context import KvContext, combined_output_cv, kv_output_cv2
from model.calibration.observation import model_hit_ratio, with_workload_cvs
from model.queueing.kv_limit import kv_batch_limit

SMOOTHING_WINDOWS = 10
SHAPE_WINDOWS = 6  # of them, the last whose request shapes are averaged into the workload


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
class _KvRead:
    """A window's KV read at its end, and its prompt and output token histograms (their exact
    sums and counts give the means)."""

    context: KvContext
    prompts: WindowHistogram
    outputs: WindowHistogram


@dataclass(frozen=True, slots=True)
class _Window:
    """What one window gives the request shape: its token means weighted by its completions
    (None: no usable means), and its KV read (None: not read)."""

    shape: tuple[float, float, float] | None
    kv: _KvRead | None


class TrafficTracker:
    """Smooths one deployment's traffic measurements over its last windows: the request shape
    sized for (`workload`) and the model's inputs (`shape`)."""

    def __init__(self, windows: int = SMOOTHING_WINDOWS) -> None:
        self._cv2 = {kind: _Smoothed(windows) for kind in LengthCvKind}
        self._arrival_index = _Smoothed(windows)
        self._cached = _Smoothed(windows)
        self._kv_capacity: float | None = None
        self._span = windows  # KV reads kept
        self._windows: deque[_Window] = deque()
        self.shape = TrafficShape()
        self.workload: Workload | None = None  # None: no window with a request shape yet
        self.unusable_shape: str | None = None  # why the last window's shape was dropped

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
        self._add_window(obs)
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

    def _add_window(self, obs: DeploymentObservation) -> None:
        """Keep the window's request shape and KV read; the workload becomes the
        completion-weighted mean of the last SHAPE_WINDOWS shapes: one window's means carry
        sampling noise (a few dozen long requests) that would move the SLO capacity from cycle to
        cycle, and a longer mean lags a change of shape. A shape whose means are not usable is
        dropped (`unusable_shape` says why)."""
        self.unusable_shape = None
        shape = None
        if obs.avg_input_tokens is not None and obs.avg_output_tokens is not None:
            try:
                means = Workload(obs.avg_input_tokens, max(obs.avg_output_tokens, 1.0))
            except ValueError as exc:
                self.unusable_shape = str(exc)
            else:
                weight = max(obs.completion_rate_rps * obs.window_s, 1.0)
                shape = (means.avg_input_tokens, means.avg_output_tokens, weight)
        prompts = obs.windows.get(HistogramName.PROMPT_LEN)
        outputs = obs.windows.get(HistogramName.GENERATION_LEN)
        kv = None
        if obs.kv_context is not None and prompts is not None and outputs is not None:
            kv = _KvRead(obs.kv_context, prompts, outputs)
        if shape is None and kv is None:
            return
        self._windows.append(_Window(shape, kv))
        self._trim()
        if shape is not None:
            shapes = [w.shape for w in self._windows if w.shape is not None]
            rows = np.array(shapes[-SHAPE_WINDOWS:])
            n, m = np.average(rows[:, :2], axis=0, weights=rows[:, 2])
            self.workload = Workload(float(n), float(m))

    def _trim(self) -> None:
        """Drop the oldest windows that neither span reads any more: the KV term reads the last
        `windows` KV reads, the workload the last SHAPE_WINDOWS shapes (a window without one
        does not push the other's out)."""
        reads = sum(w.kv is not None for w in self._windows)
        shapes = sum(w.shape is not None for w in self._windows)
        while self._windows:
            oldest = self._windows[0]
            if oldest.kv is not None and reads <= self._span:
                return
            if oldest.shape is not None and shapes <= SHAPE_WINDOWS:
                return
            self._windows.popleft()
            reads -= oldest.kv is not None
            shapes -= oldest.shape is not None

    def _kv_output_cv2(self) -> float | None:
        """cv_m^2 from the KV held over the kept windows that read it and their token means."""
        reads = [w.kv for w in self._windows if w.kv is not None][-self._span :]
        context = sum((r.context for r in reads), KvContext(0.0, 0.0))
        inputs = sum(r.prompts.count for r in reads)
        outputs = sum(r.outputs.count for r in reads)
        if inputs <= 0 or outputs <= 0:
            return None
        return kv_output_cv2(
            context,
            sum(r.prompts.sum for r in reads) / inputs,
            sum(r.outputs.sum for r in reads) / outputs,
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
