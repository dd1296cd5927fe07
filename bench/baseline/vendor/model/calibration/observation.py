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

from bench.baseline.vendor.model.queueing.validation import (
    require_at_least,
    require_int_at_least,
    require_non_negative,
    require_number,
    require_positive,
)
from bench.baseline.vendor.model.queueing.variant import ModelOptions

DEFAULT_WEIGHT = 1.0
# CVs below this are rounded to 0 on a grid: a length or arrival law this narrow is fixed.
MIN_GRID_CV = 0.05
# Workload inputs of the refined variant an observation may carry (model/queueing/variant.py).
WORKLOAD_CV_FIELDS = ("input_length_cv", "output_length_cv", "arrival_cv")


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
    the point with them in place of its options' (None: the options' value applies).
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

    def model_options(self, options: ModelOptions, *, grid: float | None = None) -> ModelOptions:
        """`options` with this window's measured CVs in place of its own (refined variant);
        with `grid` > 1, each CV rounded to the nearest power of `grid` (below
        MIN_GRID_CV: 0), so that points with nearly equal CVs share one model evaluation."""
        measured = {
            name: _on_grid(value, grid)
            for name in WORKLOAD_CV_FIELDS
            if (value := getattr(self, name)) is not None
        }
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


def with_workload_cvs(options: ModelOptions, cvs: Mapping[str, float]) -> ModelOptions:
    """`options` with the workload CVs given by field name (WORKLOAD_CV_FIELDS); the paper
    variant takes none."""
    if not cvs or not options.refined:
        return options
    return replace(
        options,
        input_length_cv=cvs.get("input_length_cv", options.input_length_cv),
        output_length_cv=cvs.get("output_length_cv", options.output_length_cv),
        arrival_cv=cvs.get("arrival_cv", options.arrival_cv),
    )
