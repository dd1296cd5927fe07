"""The tuner bench's measured truth: where the SLO capacity is read off the constant-load means."""

from __future__ import annotations

import numpy as np
import pytest

from bench.tuner_robustness import TRUTH_GRID, capacity_load

GRID = np.array(TRUTH_GRID)


def _ramp(at_grid: float, slope: float) -> list[float]:
    """Means rising linearly with the load, `at_grid` at the grid's first load."""
    return list(at_grid + slope * (GRID - GRID[0]))


def test_the_first_crossing_is_interpolated_between_its_grid_loads() -> None:
    itl = _ramp(10.0, 20.0)  # crosses 13 ms at 0.15 above the first load
    ttft = _ramp(20.0, 10.0)  # crosses 25 ms later, at 0.5 above it
    load = capacity_load(((ttft, 25.0), (itl, 13.0)))
    assert load == pytest.approx(GRID[0] + 0.15)


def test_no_crossing_reads_the_grids_last_load() -> None:
    assert capacity_load(((_ramp(1.0, 1.0), 100.0),)) == pytest.approx(GRID[-1])


def test_a_capacity_below_the_grid_is_an_error_not_the_grids_end() -> None:
    # A noisy first point just over the target once read as the grid's last load (0.95 of
    # saturation for a capacity near 0.3).
    itl = _ramp(13.01, 10.0)
    with pytest.raises(ValueError, match="below the truth grid"):
        capacity_load(((itl, 13.0),))
