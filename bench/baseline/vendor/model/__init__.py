"""Approximate queueing model of vLLM inference serving: pure math, no I/O."""

from bench.baseline.vendor.model.calibration.fit import FitMethod, FitResult, FitStatus, MetricError, fit, initial_guess
from bench.baseline.vendor.model.calibration.observation import Observation
from bench.baseline.vendor.model.calibration.tuner import Tuner
from bench.baseline.vendor.model.calibration.verdict import SkipReason, TunerReason, TunerState, TunerStatus
from bench.baseline.vendor.model.queueing.analyzer import Analysis, analyze, analyze_points, max_rate
from bench.baseline.vendor.model.queueing.chunks import chunk_table
from bench.baseline.vendor.model.queueing.params import ServerConfig, ServiceParams, Workload
from bench.baseline.vendor.model.queueing.percentile_sizing import PercentileTarget
from bench.baseline.vendor.model.queueing.percentiles import (
    FirstToken,
    LatencyMetric,
    LatencyQuantiles,
    latency_quantiles,
)
from bench.baseline.vendor.model.queueing.sizing import (
    Binding,
    ReplicaPlan,
    SizingStatus,
    SloCapacity,
    max_rate_for_slo,
    replicas_for_slo,
)
from bench.baseline.vendor.model.queueing.variant import (
    DEFAULT_MODEL,
    PAPER_MODEL,
    ArchitectureSpec,
    ModelOptions,
    ModelVariant,
)

__all__ = [
    "DEFAULT_MODEL",
    "PAPER_MODEL",
    "Analysis",
    "ArchitectureSpec",
    "ModelOptions",
    "ModelVariant",
    "Binding",
    "FirstToken",
    "LatencyMetric",
    "LatencyQuantiles",
    "PercentileTarget",
    "ReplicaPlan",
    "SizingStatus",
    "SloCapacity",
    "ServerConfig",
    "ServiceParams",
    "Workload",
    "FitMethod",
    "FitResult",
    "FitStatus",
    "MetricError",
    "Observation",
    "SkipReason",
    "Tuner",
    "TunerReason",
    "TunerState",
    "TunerStatus",
    "analyze",
    "analyze_points",
    "chunk_table",
    "fit",
    "initial_guess",
    "latency_quantiles",
    "max_rate",
    "max_rate_for_slo",
    "replicas_for_slo",
]
