"""Approximate queueing model of vLLM inference serving: pure math, no I/O."""

from model.params import ServerConfig, ServiceParams, Workload

__all__ = ["ServerConfig", "ServiceParams", "Workload"]
