"""Observations for the fit and tuner tests: the paper grid's, and synthetic ones (model
latencies at known parameters, at a given fraction of each shape's saturation rate, with
multiplicative log-normal noise)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from exporter.cli.fit import read_observations
from model import Observation, ServerConfig, ServiceParams
from model.queueing.analyzer import analyze_points
from tests.conftest import DATA_DIR

# Request shapes (avg input tokens, avg output tokens) of the synthetic windows.
SHAPES: tuple[tuple[float, float], ...] = (
    (256.0, 256.0),
    (1024.0, 1024.0),
    (4096.0, 256.0),
    (256.0, 2048.0),
)
LOADS: tuple[float, ...] = (0.2, 0.5, 0.8)  # fractions of the shape's saturation rate


def grid_observations(model_name: str) -> list[Observation]:
    """The paper's 112 fitted H100 points of one model (in_paper_fit = 1)."""
    return read_observations(
        DATA_DIR / "h100-grid.csv",
        keep=lambda row: row["model"] == model_name and row["in_paper_fit"] == "1",
    )


def observations(
    params: ServiceParams,
    server: ServerConfig,
    points: Sequence[tuple[float, float, float]],
    rng: np.random.Generator | None = None,
    noise: float = 0.0,
) -> list[Observation]:
    """One Observation per (n, m, load): rate = load x saturation rate, latencies from the
    model times exp(N(0, noise)) each."""
    n = np.array([p[0] for p in points])
    m = np.array([p[1] for p in points])
    light = analyze_points(params, server, n, m, np.full(n.shape, 1e-3))
    rate = np.array([p[2] for p in points]) * np.asarray(light.saturation_rate_rps)
    out = analyze_points(params, server, n, m, rate)
    ttft, itl = np.asarray(out.ttft_ms), np.asarray(out.itl_ms)
    if rng is not None and noise > 0:
        ttft = ttft * np.exp(rng.normal(0.0, noise, ttft.shape))
        itl = itl * np.exp(rng.normal(0.0, noise, itl.shape))
    return [
        Observation(
            rate_rps=float(rate[k]),
            avg_input_tokens=float(n[k]),
            avg_output_tokens=float(m[k]),
            ttft_ms=float(ttft[k]),
            itl_ms=float(itl[k]),
        )
        for k in range(len(points))
    ]


def grid_points() -> list[tuple[float, float, float]]:
    """Every shape at every load: 12 points."""
    return [(n, m, load) for n, m in SHAPES for load in LOADS]


def stream_points(count: int, rng: np.random.Generator) -> list[tuple[float, float, float]]:
    """A cycle-by-cycle stream: shapes in turn, loads drawn in [0.15, 0.85]."""
    return [(*SHAPES[k % len(SHAPES)], float(rng.uniform(0.15, 0.85))) for k in range(count)]


def relative_errors(actual: ServiceParams, expected: ServiceParams) -> np.ndarray:
    """|actual / expected - 1| per parameter."""
    ratio = np.array(actual.as_tuple()) / np.array(expected.as_tuple())
    errors: np.ndarray = np.abs(ratio - 1.0)
    return errors


def observations_at_rates(
    params: ServiceParams, server: ServerConfig, points: Sequence[tuple[float, float, float]]
) -> list[Observation]:
    """Noise-free Observations at (rate req/s, n, m) points."""
    rate = np.array([p[0] for p in points], dtype=float)
    n = np.array([p[1] for p in points], dtype=float)
    m = np.array([p[2] for p in points], dtype=float)
    out = analyze_points(params, server, n, m, rate)
    return [
        Observation(
            rate_rps=float(rate[k]),
            avg_input_tokens=float(n[k]),
            avg_output_tokens=float(m[k]),
            ttft_ms=float(out.ttft_ms[k]),
            itl_ms=float(out.itl_ms[k]),
        )
        for k in range(len(points))
    ]
