"""The shipped sample points (model/queueing/sample_points.npz) are the ones scipy's scrambled
Sobol' sequence makes, and a fresh process reads them without importing scipy.stats."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from model.queueing.sample_points import (
    POINTS,
    SHIPPED_DIMS,
    SHIPPED_POINTS,
    sobol_points,
    unit_points,
)
from tests.integration.test_daemon_e2e import REPO


@pytest.mark.parametrize("dims", SHIPPED_DIMS)
def test_the_shipped_points_are_the_sobol_points_bit_for_bit(dims: int) -> None:
    with np.load(SHIPPED_POINTS) as data:
        shipped = data[f"d{dims}"]
    assert shipped.shape == (dims, POINTS)
    assert np.array_equal(shipped, sobol_points(dims))
    assert np.array_equal(unit_points(dims), shipped)


def test_other_counts_are_made_on_demand() -> None:
    assert np.array_equal(unit_points(3, 64), sobol_points(3, 64))


def test_a_percentile_sizing_does_not_import_scipy_stats() -> None:
    code = (
        "import sys, model\n"
        "target = model.PercentileTarget(model.LatencyMetric.TTFT, 0.95, 100.0)\n"
        "model.max_rate_for_slo(model.ServiceParams(6.68, 2.01e-2, 5.52e-5),\n"
        "    model.ServerConfig(max_batch_size=64), model.Workload(1024, 512),\n"
        "    percentiles=[target])\n"
        "print('scipy.stats' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"
