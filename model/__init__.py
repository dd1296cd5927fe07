"""Approximate queueing model of vLLM inference serving: pure math, no I/O."""

from model.analyzer import Analysis, analyze, max_rate
from model.chunks import chunk_table
from model.params import ServerConfig, ServiceParams, Workload
from model.sizing import (
    Binding,
    ReplicaPlan,
    SizingStatus,
    SloCapacity,
    max_rate_for_slo,
    replicas_for_slo,
)

__all__ = [
    "Analysis",
    "Binding",
    "ReplicaPlan",
    "SizingStatus",
    "SloCapacity",
    "ServerConfig",
    "ServiceParams",
    "Workload",
    "analyze",
    "chunk_table",
    "max_rate",
    "max_rate_for_slo",
    "replicas_for_slo",
]
