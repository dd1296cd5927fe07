"""The real-vLLM report's attainment at vLLM's bucket bounds: the sweep keeps each window's bucket
counts, observed shares are exact at the bounds, predicted shares are the model's percentile
assembly, and the summary averages the gaps within the observed range."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from bench.real_vllm import attainment, report
from bench.real_vllm.sweep import reading
from exporter.collector.observations import observe_deployment
from exporter.collector.sources import SourceRead
from exporter.collector.vllm_metrics import parse_exposition
from model import (
    LatencyMetric,
    Observation,
    ServerConfig,
    ServiceParams,
    Workload,
    latency_quantiles,
)

SMALL_SWEEP = Path(__file__).resolve().parents[1] / "data" / "real_vllm_sweep_small.json"
TTFT = "vllm:time_to_first_token_seconds"
PARAMS = ServiceParams(alpha_ms=7.5, beta_ms=0.2, gamma_ms=8e-4)
SERVER = ServerConfig(max_batch_size=32, max_num_batched_tokens=2048)


def exposition(success: float, ttft: list[tuple[str, float]], ttft_sum: float) -> str:
    """One pod: request_success and a TTFT histogram given as [(le, cumulative count)]."""
    lines = [
        "# TYPE vllm:request_success_total counter",
        f'vllm:request_success_total{{engine="0",model_name="m"}} {success}',
        f"# TYPE {TTFT} histogram",
        *(f'{TTFT}_bucket{{engine="0",le="{le}",model_name="m"}} {n}' for le, n in ttft),
        f'{TTFT}_count{{engine="0",model_name="m"}} {ttft[-1][1]}',
        f'{TTFT}_sum{{engine="0",model_name="m"}} {ttft_sum}',
    ]
    return "\n".join(lines) + "\n"


def read(time_s: float, text: str) -> SourceRead:
    return SourceRead(time_s, (parse_exposition(text, pod="p", time_s=time_s, model_name="m"),))


def test_the_sweep_keeps_the_window_bucket_counts_and_the_report_reads_them_back() -> None:
    start = read(100.0, exposition(5, [("0.02", 1), ("0.04", 4), ("0.08", 5), ("+Inf", 5)], 0.2))
    end = read(130.0, exposition(15, [("0.02", 3), ("0.04", 9), ("0.08", 14), ("+Inf", 15)], 0.9))
    record = json.loads(json.dumps(asdict(reading(observe_deployment(start, end)))))
    stored = record["histograms"]["time_to_first_token"]
    assert stored["bounds_s"] == [0.02, 0.04, 0.08]
    assert stored["counts"] == [2.0, 3.0, 4.0, 1.0]  # the window's increase per bucket
    assert stored["count"] == 10.0 and stored["sum_s"] == pytest.approx(0.7)
    shares = attainment.observed_shares(attainment.window_histogram(stored))
    assert shares is not None
    np.testing.assert_allclose(shares, [0.2, 0.5, 0.9])


@pytest.mark.parametrize(
    ("observed", "expected"),
    [
        ([0.0, 0.0, 0.2, 0.7, 1.0, 1.0], [0, 0, 1, 1, 1, 0]),
        ([0.0, 0.3, 0.6], [0, 1, 1]),  # never all: up to the highest bound
        ([1.0, 1.0], [1, 0]),  # all below the lowest bound
        ([0.0, 0.0], [0, 0]),  # all above the highest bound
    ],
)
def test_the_observed_range_runs_from_the_first_observation_to_all(
    observed: list[float], expected: list[int]
) -> None:
    mask = attainment.in_observed_range(np.array(observed))
    assert mask.tolist() == [bool(e) for e in expected]


@pytest.mark.parametrize(
    ("metric", "field"),
    [(LatencyMetric.TTFT, "ttft_ms"), (LatencyMetric.ITL_PER_TOKEN, "itl_per_token_ms")],
)
def test_predicted_share_at_a_model_quantile_reaches_it(metric: LatencyMetric, field: str) -> None:
    """attainment(t) >= q exactly when quantile(q) <= t: at the q-quantile the share reaches q,
    just below it it does not."""
    obs = Observation(rate_rps=6.0, avg_input_tokens=512, avg_output_tokens=64, ttft_ms=50.0,
                      itl_ms=10.0, max_batch_size=32)
    qs = np.array([0.1, 0.5, 0.9, 0.99])
    values = getattr(latency_quantiles(PARAMS, SERVER, Workload(512, 64), 6.0, qs), field)
    at = attainment.predicted_shares(PARAMS, SERVER, obs, metric, list(values))
    below = attainment.predicted_shares(PARAMS, SERVER, obs, metric, list(values * (1 - 1e-6)))
    assert np.all(at >= qs - 1e-12)
    assert np.all(below < qs)


def test_the_summary_averages_in_range_gaps_of_unsaturated_points() -> None:
    def point(index: int, saturated: bool, pairs: list[tuple[float, float, bool]]
              ) -> attainment.PointAttainment:
        shares = tuple(attainment.BoundShare(bound_ms=10.0 * (k + 1), observed=o, predicted=p,
                                             in_range=r) for k, (o, p, r) in enumerate(pairs))
        m = attainment.MetricAttainment(observations=20.0, shares=shares)
        return attainment.PointAttainment(index=index, saturated=saturated,
                                          metrics={"ttft": m, "itl": m})

    points = [
        point(0, False, [(0.0, 0.1, False), (0.2, 0.3, True), (0.8, 0.6, True)]),
        point(1, False, [(0.5, 0.55, True), (1.0, 1.0, False)]),
        point(2, True, [(0.1, 0.9, True)]),  # saturated: left out
    ]
    found = attainment.summarize(points)["ttft"]
    assert found["points"] == 2 and found["bounds"] == 3
    assert found["mean_abs_gap_points"] == pytest.approx((10 + 20 + 5) / 3)
    assert found["mean_gap_points"] == pytest.approx((10 - 20 + 5) / 3)
    assert found["max_abs_gap_points"] == pytest.approx(20)


def test_the_report_on_a_small_recorded_sweep(tmp_path: Path) -> None:
    """Observed shares in the report are the sweep's own bucket counts; its summary is the mean
    of the in-range gaps it lists; the Markdown has the section and a table per point."""
    assert report.main(["--sweep", str(SMALL_SWEEP), "--out-dir", str(tmp_path)]) == 0
    sweep = json.loads(SMALL_SWEEP.read_text())
    doc = json.loads((tmp_path / report.FIT_JSON.name).read_text())
    listed = doc["attainment"]
    assert len(listed) == len(sweep["points"])
    gaps: dict[str, list[float]] = {"ttft": [], "itl": []}
    for entry in listed:
        stored = sweep["points"][entry["index"]]["observation"]["histograms"]
        for name, histogram in (("ttft", "time_to_first_token"), ("itl", "inter_token_latency")):
            m = entry["metrics"][name]
            counts = np.array(stored[histogram]["counts"])
            np.testing.assert_allclose(m["observed"], np.cumsum(counts)[:-1] / counts.sum())
            if not entry["saturated"]:
                gaps[name] += [100 * (p - o) for p, o, r in
                               zip(m["predicted"], m["observed"], m["in_range"], strict=True)
                               if r]
    summary = doc["errors"]["attainment"]["in_sample"]
    for name in ("ttft", "itl"):
        assert summary[name]["bounds"] == len(gaps[name]) > 0
        assert summary[name]["mean_abs_gap_points"] == pytest.approx(np.abs(gaps[name]).mean())
    assert doc["errors"]["attainment"]["held_out"]["ttft"]["bounds"] > 0
    text = (tmp_path / report.REPORT_MD.name).read_text()
    assert "## Attainment at vLLM's bucket bounds" in text
    header = "| metric | bound (ms) | observed | predicted | gap (points) |"
    assert text.count(header) == len(listed)
