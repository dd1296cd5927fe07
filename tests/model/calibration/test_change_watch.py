"""The change watch: a CUSUM of each new point's prediction error (change_watch.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from model.calibration.change_watch import ChangeWatch
from model.calibration.observation import Observation
from model.calibration.tuner import Tuner
from model.queueing.params import ServerConfig

DATA = Path(__file__).resolve().parents[2] / "data"


def steady(watch: ChangeWatch, count: int, noise: float = 0.02) -> None:
    """Feed `count` innovations of a well-calibrated estimate: `noise` on both metrics."""
    rng = np.random.default_rng(3)
    for ttft, itl in rng.normal(0.0, noise, (count, 2)):
        assert watch.add(float(ttft), float(itl)) is None


def test_steady_noise_never_calls_a_change() -> None:
    steady(ChangeWatch(), 500)


def test_a_ten_percent_faster_engine_is_called_within_three_points() -> None:
    # The estimate, made before the change, predicts ITL 10 % (of the measured) too high on
    # every new point; the change is dated at the first of them.
    watch = ChangeWatch()
    steady(watch, 20)
    called = [watch.add(0.01, 0.10) for _ in range(3)]
    assert called[:2] == [None, None]
    assert called[2] == 3
    assert len(watch.history) == 0  # starts over


def test_a_change_whose_third_point_falls_short_is_called_and_dated_at_its_first() -> None:
    # The estimate follows each new point part of the way, so the third innovation of a real
    # change can fall just short of the dating margin (128 / 2048 tokens, every parameter
    # / 1.1: ITL innovations about 4, 3.6, 1.9 and 4 sigmas above the centre). Requiring
    # three in a row never called it, and the old points' slope stayed in the window.
    watch = ChangeWatch()
    steady(watch, 20, noise=0.005)  # sigma at its 2 % floor
    called = [watch.add(0.0, itl) for itl in (0.10, 0.10, 0.035, 0.10)]
    assert called == [None, None, None, 4]
    assert len(watch.history) == 0


def test_a_point_slightly_off_before_the_change_is_not_dated_into_it() -> None:
    watch = ChangeWatch()
    steady(watch, 20, noise=0.005)  # sigma at its floor, 2 %
    assert watch.add(0.05, 0.0) is None  # 2.5 sigma: the sum starts
    assert watch.add(0.01, 0.0) is None  # within the allowance: the sum lingers above 0
    called = [watch.add(0.3, 0.0) for _ in range(3)]
    # Called on the third point beyond (a change persists for CHANGE_RUN points), dated at
    # the first of them, not where the sum was last 0 (five points back).
    assert called == [None, None, 3]


def test_two_ten_fold_ttft_spikes_are_not_a_change() -> None:
    watch = ChangeWatch()
    steady(watch, 20)
    for ttft in (-0.9, 0.0, -0.9, 0.0, 0.01, -0.01):  # (pred - meas) / meas at 10x measured
        assert watch.add(ttft, 0.0) is None


def test_state_round_trip() -> None:
    watch = ChangeWatch()
    steady(watch, 12)
    watch.add(0.05, 0.08)
    again = ChangeWatch.from_dict(watch.to_dict())
    assert again.to_dict() == watch.to_dict()
    assert ChangeWatch.from_dict(None).to_dict() == ChangeWatch().to_dict()


def test_a_state_saved_with_streak_counts_loads() -> None:
    # Before a run could have a gap, each side kept its count of newest points beyond in a row.
    saved = ChangeWatch().to_dict()
    del saved["beyond"]
    saved["streak"] = [0, 2, 0, 7]
    watch = ChangeWatch.from_dict(saved)
    assert [list(flags) for flags in watch.beyond] == [[], [True, True], [], [True] * 4]


def test_the_spread_outlives_a_call() -> None:
    # Traffic whose windows scatter by 10 % (lognormal lengths), then a real change: after the
    # call, a calm stretch and three tail windows are no change. With the spread read from
    # the points since the call (5 calm ones: sigma at its 2 % floor) they were one.
    watch = ChangeWatch()
    steady(watch, 20, noise=0.1)
    called = None
    while called is None:
        called = watch.add(0.0, 0.6)
    assert len(watch.spread) == 20 + called  # kept through the call
    for _ in range(5):
        assert watch.add(0.0, 0.0) is None
    for ttft in (-0.3, 0.0, -0.3, -0.3, 0.0):
        assert watch.add(ttft, 0.0) is None


def test_replayed_lognormal_windows_call_no_change() -> None:
    # The tuner points of bench/replay_trace's `ours` arm (prompts lognormal CV 1.5, outputs
    # CV 1.2, a diurnal-like rate, replicas scaling; nothing about the serving changes), as
    # the daemon fed them. The watch with a 10-point spread called a change at the 36th.
    data = json.loads((DATA / "replay-trace-tuner-points.json").read_text())
    tuner = Tuner(ServerConfig(**data["server"]), min_observations=5, window_size=10)
    for point in data["points"]:
        tuner.update(Observation.from_dict(point))
        assert tuner.to_dict()["since_change"] is None
    assert tuner.fit_count >= 30
