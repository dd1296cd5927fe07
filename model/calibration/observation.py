"""One observed operating point of one replica: the tuner's input. Tuner spec §2.

An observation is valid when the rate, the token means and both latencies are finite and
positive (output tokens >= 1, as the model requires); anything else is a ValueError naming the
field, so a bad collector window never reaches a fit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from model.queueing.validation import (
    require_at_least,
    require_int_at_least,
    require_non_negative,
    require_number,
    require_positive,
)
from model.queueing.variant import ModelOptions

DEFAULT_WEIGHT = 1.0
# CVs below this are rounded to 0 on a grid: a length or arrival law this narrow is fixed.
MIN_GRID_CV = 0.05
# Workload inputs of the refined variant an observation may carry (model/queueing/variant.py).
WORKLOAD_CV_FIELDS = ("input_length_cv", "output_length_cv", "arrival_cv")
# Hit ratios on a grid are rounded to this step: points within it share one model evaluation.
HIT_RATIO_GRID_STEP = 0.02
# The model takes a hit ratio below 1 (some prefill always runs: vLLM recomputes at least the
# last prompt token); a window read as all hits is evaluated at this.
MAX_HIT_RATIO = 0.99


@dataclass(frozen=True, slots=True, kw_only=True)
class Observation:
    """Mean behaviour of one replica over one window: rate (req/s per replica), token means,
    TTFT and ITL (ms). Tuner spec §2.

    `max_batch_size` None means the fit's ServerConfig applies; `timestamp` is the window's end
    (unix s) and only orders observations; `weight` scales the point's squared errors in the
    loss; `queue_growing` marks a window whose backlog grew (saturated: the steady-state model
    does not apply, so the tuner never fits it; spec §8); `synchronous` marks a closed
    concurrency-one benchmark run, which the refined model variant evaluates without the chain
    (model/queueing/refined.py). `input_length_cv`, `output_length_cv` and `arrival_cv` are the
    workload's measured coefficients of variation in this window; the refined variant evaluates
    the point with them in place of its options' (None: the options' value applies), and
    `prefix_hit_ratio` the share of its prompt tokens the prefix cache served, so that the fit
    does not take the skipped prefill for a faster engine (beta fitted on the hits).
    `occupancy_rate_rps` is the rate Little's law gives from the requests the engine held
    (running + waiting, the window's mean) over their lifetime: the load the window's ITL was
    made by, free of the sampling noise of the window's arrival count (model.calibration.
    itl_curve fits ITL against it).
    """

    rate_rps: float
    avg_input_tokens: float
    avg_output_tokens: float
    ttft_ms: float
    itl_ms: float
    max_batch_size: int | None = None
    timestamp: float | None = None
    weight: float = DEFAULT_WEIGHT
    queue_growing: bool = False
    synchronous: bool = False
    input_length_cv: float | None = None
    output_length_cv: float | None = None
    arrival_cv: float | None = None
    prefix_hit_ratio: float | None = None
    occupancy_rate_rps: float | None = None

    def __post_init__(self) -> None:
        for name in ("rate_rps", "avg_input_tokens", "ttft_ms", "itl_ms", "weight"):
            object.__setattr__(self, name, require_positive(name, getattr(self, name)))
        # The model needs at least one output token per request (the first one is the TTFT).
        object.__setattr__(
            self,
            "avg_output_tokens",
            require_at_least("avg_output_tokens", self.avg_output_tokens, 1),
        )
        if self.max_batch_size is not None:
            object.__setattr__(
                self,
                "max_batch_size",
                require_int_at_least("max_batch_size", self.max_batch_size, 1),
            )
        if self.timestamp is not None:
            object.__setattr__(self, "timestamp", require_number("timestamp", self.timestamp))
        if not isinstance(self.queue_growing, bool):
            raise ValueError(f"`queue_growing` must be a bool, got {self.queue_growing!r}")
        if not isinstance(self.synchronous, bool):
            raise ValueError(f"`synchronous` must be a bool, got {self.synchronous!r}")
        for name in WORKLOAD_CV_FIELDS:
            if getattr(self, name) is not None:
                object.__setattr__(self, name, require_non_negative(name, getattr(self, name)))
        if self.prefix_hit_ratio is not None:
            hit = require_non_negative("prefix_hit_ratio", self.prefix_hit_ratio)
            if hit > 1:
                raise ValueError(f"`prefix_hit_ratio` must be in [0, 1], got {hit}")
            object.__setattr__(self, "prefix_hit_ratio", model_hit_ratio(hit))
        if self.occupancy_rate_rps is not None:
            rate = require_positive("occupancy_rate_rps", self.occupancy_rate_rps)
            object.__setattr__(self, "occupancy_rate_rps", rate)

    def model_options(self, options: ModelOptions, *, grid: float | None = None) -> ModelOptions:
        """`options` with this window's measured CVs and hit ratio in place of its own (refined
        variant); with `grid` > 1, each CV rounded to the nearest power of `grid` (below
        MIN_GRID_CV: 0) and the hit ratio to HIT_RATIO_GRID_STEP, so that points with nearly
        equal inputs share one model evaluation."""
        measured = {
            name: _on_grid(value, grid)
            for name in WORKLOAD_CV_FIELDS
            if (value := getattr(self, name)) is not None
        }
        if self.prefix_hit_ratio is not None:
            hit = self.prefix_hit_ratio
            if grid is not None:
                hit = min(round(hit / HIT_RATIO_GRID_STEP) * HIT_RATIO_GRID_STEP, MAX_HIT_RATIO)
            measured["prefix_hit_ratio"] = hit
        return with_workload_cvs(options, measured)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe mapping of every field (ms, req/s, unix s)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Observation:
        """Inverse of to_dict; unknown keys are refused so a typo cannot pass silently."""
        if not isinstance(data, Mapping):
            raise ValueError(f"`observation` must be a mapping, got {data!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"`observation` has unknown keys {unknown}, allowed: {sorted(known)}")
        required = ("rate_rps", "avg_input_tokens", "avg_output_tokens", "ttft_ms", "itl_ms")
        missing = [name for name in required if name not in data]
        if missing:
            raise ValueError(f"`observation` is missing keys {missing}")
        return cls(**dict(data))


def _on_grid(cv: float, grid: float | None) -> float:
    if grid is None:
        return cv
    if cv < MIN_GRID_CV:
        return 0.0
    return float(grid ** round(math.log(cv) / math.log(grid)))


def model_hit_ratio(ratio: float) -> float:
    """A measured share of prompt tokens cached as the model takes it: below 1."""
    return min(ratio, MAX_HIT_RATIO)


def with_workload_cvs(options: ModelOptions, cvs: Mapping[str, float]) -> ModelOptions:
    """`options` with the workload CVs and prefix-hit ratio given by field name
    (WORKLOAD_CV_FIELDS, prefix_hit_ratio); the paper variant takes none."""
    if not cvs or not options.refined:
        return options
    return replace(
        options,
        input_length_cv=cvs.get("input_length_cv", options.input_length_cv),
        output_length_cv=cvs.get("output_length_cv", options.output_length_cv),
        arrival_cv=cvs.get("arrival_cv", options.arrival_cv),
        prefix_hit_ratio=cvs.get("prefix_hit_ratio", options.prefix_hit_ratio),
    )
