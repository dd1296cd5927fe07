"""Single-shape traffic on one simulated vLLM replica, observed window by window as the closed
loop observes it (exporter/replay/perfect.py): what most production deployments show the tuner.

The load wanders between two fractions of the replica's saturation rate (a new level drawn
every `hold_s`, reached by a linear ramp over the hold, so consecutive 30 s windows differ by a
few percent and the daemon's steady-window filter keeps them); lengths are uniform on
[x/2, 3x/2]; Poisson arrivals. First-token convention: the simulator's (first token with the
last prefill chunk), as in every closed-loop figure.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from exporter.replay.perfect import WindowView, observe_window
from model.queueing.analyzer import max_rate
from model.queueing.params import ServerConfig, ServiceParams, Workload
from model.simulation.simulator import Simulator
from model.simulation.workloads import LengthDist, LengthKind, RateProfile, RateSegment, draw_trace

WINDOW_S = 30.0
SAMPLE_S = 5.0  # gauge samples per window (running, waiting) for the backlog test
HOLD_S = 600.0


def saturation_rate_rps(params: ServiceParams, server: ServerConfig, n: float, m: float) -> float:
    """The model's saturation rate of one replica at this shape (req/s)."""
    return float(max_rate(params, server, Workload(n, m)))


def wandering_profile(
    rate_rps: float, duration_s: float, rng: np.random.Generator, low: float, high: float
) -> RateProfile:
    """Load between low and high x rate_rps: a new level every HOLD_S, ramped to linearly."""
    levels = rng.uniform(low, high, int(np.ceil(duration_s / HOLD_S)) + 1) * rate_rps
    return RateProfile(
        tuple(
            RateSegment(HOLD_S, float(levels[k]), float(levels[k + 1]))
            for k in range(len(levels) - 1)
        )
    )


def simulate_windows(
    truth: ServiceParams,
    server: ServerConfig,
    shape: tuple[float, float],
    profile: RateProfile,
    duration_s: float,
    seed: int,
    *,
    window_s: float = WINDOW_S,
    sample_s: float = SAMPLE_S,
) -> list[WindowView]:
    """One replica under `profile` for `duration_s`, one view per `window_s` window, its gauges
    sampled every `sample_s`."""
    rng = np.random.default_rng(seed)
    n, m = shape
    trace = draw_trace(
        profile,
        LengthDist(LengthKind.UNIFORM, n),
        LengthDist(LengthKind.UNIFORM, m),
        rng,
        duration_s=duration_s,
    )
    sim = Simulator(truth, server, replicas=1, max_jump_s=1.0, record_iterations=True)
    sim.add_requests(trace)
    views: list[WindowView] = []
    status = sim.replica_status()
    steps = int(round(window_s / sample_s))
    for k in range(int(duration_s // window_s)):
        t0 = k * window_s
        samples = []
        for j in range(1, steps + 1):
            sim.run(t0 + j * sample_s)
            samples.append(sim.replica_status())
        records = sim.drain_records()
        views.append(
            observe_window(sim.result(), t0, t0 + window_s, status, samples, records=records)
        )
        status = samples[-1]
    return views


def shifted(views: list[WindowView], offset_s: float) -> list[WindowView]:
    """The views moved later by offset_s (to append a second run after a first)."""
    return [
        replace(
            v, observation=replace(v.observation, end_time_s=v.observation.end_time_s + offset_s)
        )
        for v in views
    ]


# Per-window measurement noise of the H100 grid (../shared/data/paper-grid/h100-grid.csv): the
# robust standard deviation (1.4826 x MAD) of its points' relative deviations, the lengths from
# their sweep's nominal, the latencies from a smooth curve (second differences of log latency
# over the lower half of each sweep's loads, / sqrt(6)); the rate's is taken as the input
# length's. Each is multiplied by `scale` in `noisy` (the bench states the scale it uses).
GRID_NOISE = {"rate": 0.015, "input": 0.015, "output": 0.010, "ttft": 0.059, "itl": 0.010}


def noisy(views: list[WindowView], rng: np.random.Generator, scale: float) -> list[WindowView]:
    """The views with lognormal per-window noise of GRID_NOISE x `scale` on the observed rate,
    token means and mean latencies, on top of the simulated windows' own sampling noise."""
    out = []
    for view in views:
        obs = view.observation
        if obs.ttft_ms is None or obs.itl_ms is None or obs.avg_input_tokens is None:
            out.append(view)
            continue
        f = {k: float(np.exp(scale * s * rng.standard_normal())) for k, s in GRID_NOISE.items()}
        noisy_obs = replace(
            obs,
            arrival_rate_rps=obs.arrival_rate_rps * f["rate"],
            avg_input_tokens=obs.avg_input_tokens * f["input"],
            avg_output_tokens=None
            if obs.avg_output_tokens is None
            else max(obs.avg_output_tokens * f["output"], 1.0),
            ttft_ms=obs.ttft_ms * f["ttft"],
            itl_ms=obs.itl_ms * f["itl"],
        )
        out.append(replace(view, observation=noisy_obs))
    return out
