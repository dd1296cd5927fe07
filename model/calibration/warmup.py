"""Compiling the model's kernel ahead of use: every compiled loop the model calls, on a tiny
problem, so that a daemon's first cycle is not the one that waits for the compiler (about 30 s
CPU cold; a fraction of a second from the on-disk cache). `python -m model.calibration.warmup`
fills the cache ahead: `make venv` and the image build run it (model/queueing/kernel/jit.py)."""

from __future__ import annotations

import numpy as np

from model.calibration.fit import fit
from model.calibration.observation import Observation
from model.queueing.analyzer import analyze
from model.queueing.params import ServerConfig, ServiceParams, Workload
from model.queueing.percentile_sizing import PercentileTarget
from model.queueing.percentiles import LatencyMetric, latency_quantiles
from model.queueing.sizing import max_rate_for_slo
from model.queueing.variant import DEFAULT_MODEL, PAPER_MODEL, ModelOptions
from model.simulation.bucket_kernel import bucket_add
from model.simulation.compiled_fleet import CompiledFleet
from model.simulation.simulator import simulate
from model.simulation.workloads import RequestTrace

_PARAMS = ServiceParams(5.0, 0.05, 5e-5)
_SERVER = ServerConfig(max_batch_size=4, max_num_batched_tokens=64)
_SHAPE = Workload(100.0, 20.0)


def compile_model_kernel() -> None:
    """Run each model path once (mean and percentile sizing, both variants, a finite waiting
    room, bursty and constant-rate arrivals, a fit); compiles whatever is not cached."""
    bursty = ModelOptions(arrival_cv=2.0, input_length_cv=0.5)
    steady = ModelOptions(arrival_cv=0.0)
    finite = ServerConfig(max_batch_size=4, max_num_batched_tokens=64, max_queue_size=2)
    for options in (DEFAULT_MODEL, PAPER_MODEL, bursty, steady):
        analyze(_PARAMS, _SERVER, _SHAPE, 1.0, options=options)
        analyze(_PARAMS, finite, _SHAPE, np.array([0.5, 1.0]), options=options)
        max_rate_for_slo(_PARAMS, _SERVER, _SHAPE, ttft_ms=200.0, itl_ms=10.0, options=options)
    target = PercentileTarget(LatencyMetric.TTFT, 0.9, 200.0)
    max_rate_for_slo(_PARAMS, _SERVER, _SHAPE, percentiles=[target])
    latency_quantiles(_PARAMS, _SERVER, _SHAPE, 1.0, [0.5, 0.9], options=steady)
    points = [
        Observation(rate_rps=r, avg_input_tokens=100.0, avg_output_tokens=20.0,
                    ttft_ms=30.0 + 10.0 * r, itl_ms=6.0 + r)
        for r in (0.5, 1.0, 2.0)
    ]  # fmt: skip
    fit(points, _SERVER)
    # The simulator's compiled replica step (a replay's), preemption included.
    trace = RequestTrace(np.array([0.0, 0.0, 0.1]), np.array([60, 50, 40]), np.array([30, 20, 5]))
    simulate(_PARAMS, _SERVER, trace, kv_capacity_tokens=150)
    # A replay's compiled event loop, a fleet scaled up and down, and its histogram counting.
    fleet = CompiledFleet(_PARAMS, _SERVER, kv_capacity_tokens=150, startup_delay_s=0.05,
                          max_jump_s=0.01)
    fleet.add_requests(trace)
    fleet.set_replicas(2)
    fleet.advance_sampled([0.05, 0.1])
    fleet.set_replicas(1)
    fleet.advance(1.0)
    counts = np.zeros(3)
    bucket_add(np.array([1.0, 2.0]), np.array([0.5, 3.0]), np.empty(0), counts)
    bucket_add(np.array([1.0, 2.0]), np.array([1.5]), np.array([2.0]), counts)


if __name__ == "__main__":
    compile_model_kernel()
