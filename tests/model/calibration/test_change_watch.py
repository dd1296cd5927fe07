"""The change watch: a CUSUM of each new point's prediction error (change_watch.py)."""

from __future__ import annotations

import numpy as np

from model.calibration.change_watch import ChangeWatch


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


def test_a_point_slightly_off_before_the_change_is_not_dated_into_it() -> None:
    watch = ChangeWatch()
    steady(watch, 20, noise=0.005)  # sigma at its floor, 2 %
    assert watch.add(0.05, 0.0) is None  # 2.5 sigma: the sum starts
    assert watch.add(0.01, 0.0) is None  # within the allowance: the sum lingers above 0
    called = [watch.add(0.3, 0.0) for _ in range(2)]
    assert called == [None, 2]  # the two points beyond, not the four since the sum was 0


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
