"""The demo's report: the summary's figures and the PNG's shading and ticks."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pytest

from exporter.cli.demo_report import (
    CycleRow,
    RunSetting,
    _spans,
    line,
    plot_run,
    summary,
    tuner_note,
)
from model import ServiceParams
from model.simulation.workloads import RateProfile

matplotlib.use("Agg")

TRUE = ServiceParams(6.68, 2.01e-2, 5.52e-5)
SETTING = RunSetting(
    slo_ttft_ms=50.0,
    slo_itl_ms=25.0,
    cycle_s=30.0,
    startup_delay_s=90.0,
    look_ahead_s=90.0,
    true_params=TRUE,
)
BASE = CycleRow(
    t_s=30.0, true_rate_rps=5.0, arrival_rate_rps=5.0, current=1, desired=1, reason="at_target",
    observed_ttft_ms=40.0, predicted_ttft_ms=40.0, observed_itl_ms=10.0, predicted_itl_ms=10.0,
    tuner="fitted", tuner_reason="accepted", params=ServiceParams(6.68, 1.0e-2, 5.52e-5),
)  # fmt: skip


def run_rows() -> list[CycleRow]:
    """Two warm-up cycles; a miss while a scale-up is pending; a miss with nothing pending."""
    warm = replace(BASE, tuner="warming", tuner_reason="collecting", predicted_ttft_ms=None,
                   predicted_itl_ms=None, params=None)  # fmt: skip
    rows = [replace(warm, t_s=30.0), replace(warm, t_s=60.0)]
    rows.append(replace(BASE, t_s=90.0, desired=2, reason="scale_up"))
    rows.append(replace(BASE, t_s=120.0, observed_ttft_ms=60.0, predicted_ttft_ms=48.0))
    rows.append(replace(BASE, t_s=150.0, current=2, desired=2))
    rows.append(replace(BASE, t_s=180.0, current=2, desired=2, observed_itl_ms=30.0))
    return rows


def test_summary_counts_warm_up_misses_and_misses_while_loading() -> None:
    text = summary(run_rows(), SETTING, late_ticks=3, ticks=100)
    assert "look-ahead 90 s" in text
    assert "warm-up: 2 cycles without parameters" in text
    assert "SLO misses: 2 of 6 cycles" in text
    assert "1 of them while a replica asked for was still loading" in text
    assert "replicas: mean 1.33, peak 2" in text
    # TTFT errors after warm-up: 0, 0.2, 0, 0 -> median 0; ITL: 0, 0, 0, 1/3 -> median 0.
    assert "median TTFT 0.0 %, ITL 0.0 %" in text
    assert "beta 50.2 %" in text and "sizing uses the predictions" in text
    assert "emulator: 3 late ticks of 100" in text


def test_the_line_and_the_note_show_the_tuner_reason() -> None:
    holding = replace(BASE, tuner="holding", tuner_reason="unidentified")
    assert "holding (unidentified)" in line(holding)
    assert "tuner holding: the window does not identify every parameter" in tuner_note(holding)
    assert "fitted " in line(BASE) and "(accepted)" not in line(BASE)


def test_consecutive_flagged_cycles_make_one_span() -> None:
    t = np.array([0.5, 1.0, 1.55, 2.0, 2.5, 3.0])
    assert _spans([True, True, True, False, True, False], t, 0.5) == [(0.0, 1.55), (2.0, 2.5)]
    assert _spans([False] * 6, t, 0.5) == []


def test_plot_shades_warm_up_and_misses_with_integer_replica_ticks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib.pyplot as plt

    figures: list[Any] = []
    original = plt.subplots

    def keep(*args: Any, **kwargs: Any) -> Any:
        fig, axes = original(*args, **kwargs)
        figures.append(axes)
        return fig, axes

    monkeypatch.setattr(plt, "subplots", keep)
    plot_run(run_rows(), tmp_path / "demo.png", RateProfile.paper(5.0), SETTING)
    assert (tmp_path / "demo.png").stat().st_size > 10_000
    axes = figures[0]
    legend = [t.get_text() for t in axes[0].get_legend().get_texts()]
    assert "warm-up: no parameters yet" in legend and "cycle over a target" in legend
    assert len(axes[2].patches) == 3  # axvspan rectangles:  # one warm-up run, two separate misses
    assert all(float(v).is_integer() for v in axes[1].get_yticks())
