"""The public scale-down window the recommender and the fleet plan share."""

from __future__ import annotations

from exporter.sizing.stabilization import ScaleDownWindow


def test_a_rise_is_followed_at_once_a_fall_after_the_whole_window() -> None:
    window = ScaleDownWindow(300.0)
    assert window.highest(0.0) is None
    assert window.hold(0.0, 2) == 2
    assert window.hold(30.0, 5) == 5  # up at once
    assert window.hold(60.0, 1) == 5  # down held
    assert window.hold(330.0, 1) == 5  # 5 wanted at 30 s is still inside [30, 330]
    assert window.hold(331.0, 1) == 1
    assert window.highest(331.0) == 1
    assert window.entries() == [(60.0, 1), (330.0, 1), (331.0, 1)]


def test_restore_keeps_the_window_and_clamps_to_the_bounds() -> None:
    window = ScaleDownWindow(100.0)
    window.restore([(0.0, 9), (150.0, 12), (190.0, 0), (400.0, 3)], 200.0, 1, 10)
    assert window.entries() == [(150.0, 10), (190.0, 1)]
    assert window.highest(200.0) == 10
