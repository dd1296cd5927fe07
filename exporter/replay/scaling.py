"""How a replay scales a trace's rate by k: two modes, said in the report.

- `copies` (the reader's `rate_scale`, exporter/replay/trace.py): each request k times, the
  copies between it and the next request; the rate profile scales and so does every burst, so
  the scaled traffic is exactly as bursty as the original, relative to its mean.
- `users`: k independent populations of the same users: floor(k) copies of the whole trace,
  each shifted in time by its own uniform offset and wrapped around the trace's span, plus one
  more copy thinned to frac(k) (k < 1 only thins). The mean rate is k times the original's and
  the bursts of different copies fall at different times, so the load is smoother relative to
  its mean, as many independent users make it. The copy of offset 0 is the trace itself.

`users` needs the trace whole (the shifts wrap around its end); the replay reads it at once.
"""

from __future__ import annotations

import math
from enum import StrEnum

import numpy as np

from model.simulation.workloads import RequestTrace


class ScaleMode(StrEnum):
    """How `--rate-scale` makes more traffic."""

    COPIES = "copies"
    USERS = "users"


def independent_users(
    trace: RequestTrace, k: float, span_s: float, rng: np.random.Generator
) -> RequestTrace:
    """`trace` scaled by k as k independent populations (see the module docstring); arrivals
    stay in [0, span_s), sorted."""
    if not (math.isfinite(k) and k > 0):
        raise ValueError(f"`k` must be a number > 0, got {k}")
    if not (math.isfinite(span_s) and span_s > 0):
        raise ValueError(f"`span_s` must be a number > 0, got {span_s}")
    whole = math.floor(k)
    offsets = [0.0, *(float(x) for x in rng.random(max(whole - 1, 0)) * span_s)][:whole]
    parts = [(offset, np.ones(len(trace), dtype=bool)) for offset in offsets]
    if k > whole:
        extra = 0.0 if whole == 0 else float(rng.random() * span_s)
        parts.append((extra, rng.random(len(trace)) < k - whole))
    times = np.concatenate([np.mod(trace.arrival_s[keep] + offset, span_s)
                            for offset, keep in parts])
    n_in = np.concatenate([trace.input_tokens[keep] for _, keep in parts])
    n_out = np.concatenate([trace.output_tokens[keep] for _, keep in parts])
    cached = None if trace.cached_tokens is None else np.concatenate(
        [trace.cached_tokens[keep] for _, keep in parts])
    order = np.argsort(times, kind="stable")
    return RequestTrace(times[order], n_in[order], n_out[order],
                        None if cached is None else cached[order])


def burstiness(arrival_s: np.ndarray, bin_s: float = 1.0) -> float:
    """The CV of the arrivals counted in `bin_s` bins over their span: 0 for an even stream,
    about 1/sqrt(rate x bin) for Poisson, more for bursts."""
    if arrival_s.size == 0:
        return 0.0
    bins = max(1, math.ceil(float(arrival_s.max()) / bin_s + 1e-9))
    counts = np.bincount((arrival_s // bin_s).astype(np.int64), minlength=bins)
    mean = float(counts.mean())
    return float(counts.std()) / mean if mean > 0 else 0.0
