"""`vllm-sizer plan` with percentile targets: sized on them, their columns printed, the PNG
drawn."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.cli.main import main
from model import (
    LatencyMetric,
    PercentileTarget,
    ServerConfig,
    ServiceParams,
    Workload,
    max_rate_for_slo,
)

LLAMA = ServiceParams(6.68, 2.01e-2, 5.52e-5)  # the default preset


def test_plan_sizes_on_percentile_targets_and_draws_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png = tmp_path / "plan.png"
    args = ["plan", "--slo", "ttft.p95_ms=300", "--slo", "itl.p99_ms=40", "--png", str(png)]
    assert main(args) == 0
    out = capsys.readouterr().out
    targets = (
        PercentileTarget(LatencyMetric.TTFT, 0.95, 300.0),
        PercentileTarget(LatencyMetric.ITL_PER_TOKEN, 0.99, 40.0),
    )
    capacity = max_rate_for_slo(LLAMA, ServerConfig(), Workload(1024, 512), percentiles=targets)
    assert f"SLO capacity {capacity.rate_rps:.4g} req/s ({capacity.binding_name}:" in out
    assert "| ttft_p95 ms | itl_per_token_p99 ms" in out
    assert "no --ttft-ms" not in out
    assert png.stat().st_size > 10_000
