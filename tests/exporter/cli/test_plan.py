"""`vllm-sizer plan` with percentile targets: sized on them, their columns printed, the PNG
drawn."""

from __future__ import annotations

import json
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


def one_point_state(path: Path, rate_rps: float = 6.5, slope_known: bool = False) -> None:
    """A daemon state file whose one deployment ('laptop') calibrated on windows at one
    operating point, one replica at `rate_rps`, with latencies from the paper's parameters
    (a partial fit, not trusted); `slope_known` as the daemon saves it."""

    from model import Observation, analyze
    from model.calibration.tuner import Tuner

    tuner = Tuner()
    shape = Workload(1024, 512)
    for k in range(8):
        rate = rate_rps * (1.0 + 0.02 * ((k % 3) - 1))
        at = analyze(LLAMA, ServerConfig(), shape, rate)
        tuner.update(
            Observation(
                rate_rps=rate, avg_input_tokens=1024.0, avg_output_tokens=512.0,
                ttft_ms=float(at.ttft_ms) * 0.8, itl_ms=float(at.itl_ms),
            )
        )  # fmt: skip
    entry = {"tuner": tuner.to_dict(), "workload": [1024, 512], "slope_known": slope_known}
    state = {"deployments": {"laptop": entry}}
    path.write_text(json.dumps({"version": 1, "state": state}))


def test_plan_from_a_state_file_says_how_far_its_claims_lie_from_the_windows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state.json"
    one_point_state(state)
    assert main(["plan", "--state", str(state), "--ttft-ms", "50", "--itl-ms", "25"]) == 0
    out = capsys.readouterr().out
    assert "observed (laptop, not trusted): 8 windows at 6.37-6.63 req/s per replica" in out
    ratio = float(out.split("SLO capacity's extrapolation ratio: ")[1].split()[0])
    capacity = float(out.split("SLO capacity ")[1].split()[0])
    assert ratio == pytest.approx(capacity / 6.63, rel=1e-2)
    assert "(extrapolated)" in out if ratio > 1.1 else "(within them)" in out
    # Each row of the per-replica table carries its own distance from the windows.
    assert "| wait ms | extrapolation" in out
    rows = [line for line in out.splitlines() if line.startswith("  ") and line.count("|") == 5]
    assert len(rows) == 10
    for row in rows:
        rate, distance = float(row.split("|")[0]), float(row.split("|")[-1])
        expected = rate / 6.63 if rate > 6.63 else 6.37 / rate if rate < 6.37 else 1.0
        assert distance == pytest.approx(expected, rel=0.01), row
    # A fit that put the latency into alpha (flags override the state's parameters) claims
    # 17.3 req/s; at one operating point, with how latency grows identified nowhere else, the
    # daemon publishes what the windows served: the highest rate, and as saturation the
    # highest rate served stably.
    heavy = ["--alpha-ms", "9.717", "--beta-ms", "9.437e-3", "--gamma-ms", "1.497e-5"]
    targets = ["--ttft-ms", "50", "--itl-ms", "25"]
    assert main(["plan", "--state", str(state), *targets, *heavy]) == 0
    out = capsys.readouterr().out
    assert "SLO capacity 17.3 req/s" in out
    assert "SLO capacity's extrapolation ratio: 2.61 (extrapolated)" in out
    assert (
        "capacity the daemon publishes from these windows: 6.63 req/s (extrapolation ratio 1), "
        "saturation 6.63 req/s"
    ) in out
    # Where the daemon had seen the growth with load (spread loads, a full fit), the model's.
    one_point_state(state, slope_known=True)
    assert main(["plan", "--state", str(state), *targets, *heavy]) == 0
    out = capsys.readouterr().out
    assert "SLO capacity's extrapolation ratio: 2.61 (extrapolated)" in out
    assert "capacity the daemon publishes" not in out


def test_plan_state_errors_name_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state.json"
    one_point_state(state)
    assert main(["plan", "--state", str(state), "--deployment", "other"]) == 2
    assert "--deployment 'other': not in --state" in capsys.readouterr().err
    assert main(["plan", "--state", str(tmp_path / "none.json")]) == 2
    assert "unreadable" in capsys.readouterr().err
    bad = json.loads(state.read_text())
    bad["state"]["deployments"]["laptop"]["slope_known"] = "yes"
    state.write_text(json.dumps(bad))
    assert main(["plan", "--state", str(state)]) == 2
    assert "slope_known must be true or false, got 'yes'" in capsys.readouterr().err
