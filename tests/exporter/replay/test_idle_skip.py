"""Idle stretches are skipped whole (issue 40, RP1): rows 1e6 or 1e9 s apart replay in a few
dozen simulated windows, and skipping changes no figure of the report."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from exporter.cli.main import main
from exporter.config.values import TunerConfig
from exporter.replay.arrivals import DrawnArrivals
from exporter.replay.policies import PolicyName
from exporter.replay.session import ReplayResult, replay, rest_windows, result_json
from exporter.replay.settings import ReplaySettings, load_settings
from model.queueing.params import ServiceParams
from model.simulation.workloads import RequestTrace
from tests.conftest import DATA_DIR

TRUTH = ServiceParams(6.68, 0.0201, 5.52e-5)
CONFIG = DATA_DIR / "replay-sample.yaml"


def _settings(**deployment: Any) -> ReplaySettings:
    s = load_settings(CONFIG)
    return replace(s, deployment=replace(s.deployment, max_replicas=6, **deployment),
                   startup_delay_s=60.0)


def _bursts(*parts: tuple[float, float, float], seed: int = 3) -> RequestTrace:
    """Poisson bursts (start s, rate req/s, span s)."""
    rng = np.random.default_rng(seed)
    times = np.sort(np.concatenate([rng.uniform(t0, t0 + span, rng.poisson(rate * span))
                                    for t0, rate, span in parts]))
    return RequestTrace(times, rng.integers(200, 2000, times.size),
                        rng.integers(50, 400, times.size))


def _run(settings: ReplaySettings, trace: RequestTrace, skip: bool) -> ReplayResult:
    return replay(settings, TRUTH, tuple(PolicyName), DrawnArrivals(trace), skip_idle=skip)


def _figures(result: ReplayResult) -> dict[str, Any]:
    out = result_json(result, 2.5)
    out.pop("wall_s")
    return out


def test_rows_1e6_and_1e9_s_apart_step_a_few_windows_and_cost_the_whole_span() -> None:
    settings = _settings()
    window_s = settings.window_s

    def two_rows(gap_s: float) -> RequestTrace:
        return RequestTrace(np.array([1.0, 1.0 + gap_s]), np.array([500, 800]),
                            np.array([100, 50]))

    # The windows judged are the same for any gap longer than the trailing window: stepped
    # through a short one for reference.
    short = _run(settings, two_rows(3000.0), skip=False)
    assert short.windows_stepped == short.windows == 101
    for gap_s in (1e6, 1e9):
        result = _run(settings, two_rows(gap_s), skip=True)
        assert result.windows == math.ceil((1.0 + gap_s) / window_s)
        assert result.arrivals == 2 and not result.partial
        # Stepping window by window (as before) simulates every one of them.
        assert result.windows_stepped < 4 * rest_windows(settings) + 10 < result.windows / 500
        fixed = result.cards["fixed"]
        # The fixed fleet holds its count through the gap, and pays for it.
        assert fixed.windows == result.windows
        held = settings.fixed_replicas
        assert fixed.replica_windows == 1 + held * (result.windows - 1)
        for name, card in result.cards.items():
            assert card.all_judged == short.cards[name].all_judged > 0
            assert card.all_met == short.cards[name].all_met
            assert sum(card.reasons.values()) == result.windows
        report = _figures(result)
        assert report["duration_s"] == result.windows * window_s
        assert len(report["series"]["offered_rps"]) == result.windows_stepped + 1


def test_skipping_a_gap_changes_no_figure_of_the_report() -> None:
    # A long scale-down stabilization: the skip must wait it out, as every other timer.
    settings = _settings(scale_down_stabilization_s=600.0)
    trace = _bursts((0.0, 14.0, 300.0), (3900.0, 6.0, 300.0))
    skipped, stepped = _run(settings, trace, True), _run(settings, trace, False)
    assert stepped.windows_stepped == stepped.windows == skipped.windows == 140
    assert skipped.windows_stepped < 100
    a, b = _figures(skipped), _figures(stepped)
    series_a, series_b = a.pop("series"), b.pop("series")
    assert a == b
    for name in a["policies"]:
        rows_a, rows_b = series_a[name], series_b[name]
        ends = rows_a["end_s"]
        # The stretch's row equals every window it stands for (but its end).
        for j, end_s in enumerate(ends):
            first = 0 if j == 0 else round(ends[j - 1] / settings.window_s)
            for k in range(first, round(end_s / settings.window_s)):
                for key in rows_a:
                    if key != "end_s":
                        assert rows_a[key][j] == rows_b[key][k], (name, key, k)
    # Every policy scaled during the first burst and came back down before the gap was skipped.
    assert max(series_b["ours"]["provisioned"]) > 1


def test_a_trace_without_a_long_gap_gives_the_identical_report() -> None:
    settings = _settings()
    trace = _bursts((0.0, 8.0, 400.0), (500.0, 3.0, 200.0))
    skipped, stepped = _run(settings, trace, True), _run(settings, trace, False)
    assert skipped.windows_stepped == skipped.windows
    assert _figures(skipped) == _figures(stepped)


def test_a_trace_file_with_rows_1e6_s_apart_replays(tmp_path: Path) -> None:
    trace = tmp_path / "gap.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                     "2024-05-10 08:00:00.0,1253,144\n"
                     "2024-05-21 21:46:40.0,2237,223\n")  # 1e6 s later
    out = tmp_path / "out"
    assert main(["replay", "--trace", str(trace), "--config", str(CONFIG), "--out", str(out),
                 "--progress", "never", "--no-fixed-best"]) == 0
    report = json.loads((out / "replay.json").read_text())
    assert report["arrivals"] == 2
    assert report["windows"] == math.ceil(1e6 / 30.0)  # the window holding the last row
    assert len(report["series"]["offered_rps"]) < 100
    fixed = report["policies"]["fixed"]
    assert fixed["replica_hours"] == (1 + 3 * (report["windows"] - 1)) * 30.0 / 3600.0


def test_the_rest_outlasts_every_timer_in_seconds_and_the_tuner_counts_in_cycles() -> None:
    settings = _settings()
    assert rest_windows(settings) == 300.0 / 30.0 + 1  # the reactive HPA's 300 s window
    longer = _settings(scale_down_stabilization_s=900.0)
    assert rest_windows(longer) == 900.0 / 30.0 + 1
    counted = _settings(tuner=TunerConfig(min_observations=5, window=40))
    assert rest_windows(counted) == 41
