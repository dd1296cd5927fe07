"""The HPA's arithmetic on one AverageValue metric, case by case (Kubernetes' documented
behaviour: autoscaling/v2 `behavior`, tolerance, stabilization, rate-limit policies)."""

from __future__ import annotations

import pytest

from exporter.replay.engine import Proposal
from exporter.replay.hpa import Behavior, Hpa, PolicyKind, Rules, Select, StepPolicy

FREE = Behavior(scale_up=Rules(tolerance=0.0, policies=(StepPolicy(PolicyKind.PODS, 1000),)),
                scale_down=Rules(tolerance=0.0))


def _value(value: float, target: float = 1.0) -> Proposal:
    return Proposal(value=value, target=target)


def test_average_value_is_ceil_of_value_over_target_whatever_the_current_count() -> None:
    hpa = Hpa(FREE, 1, 50)
    assert hpa.scale(0.0, 3, _value(3.0)) == 3  # Value would give 9
    assert hpa.scale(15.0, 3, _value(21.0, target=5.0)) == 5


def test_tolerance_keeps_the_count_inside_the_dead_band() -> None:
    hpa = Hpa(Behavior.kubernetes_default(), 1, 50)
    assert hpa.scale(0.0, 20, _value(21.0)) == 20  # 21 / 20 = 1.05, within 10 %
    assert hpa.scale(15.0, 20, _value(23.0)) == 23


def test_scale_down_stabilization_holds_the_highest_recent_recommendation() -> None:
    hpa = Hpa(Behavior.kubernetes_default(), 1, 50)
    assert hpa.scale(0.0, 4, _value(8.0)) == 8
    assert hpa.scale(30.0, 8, _value(2.0)) == 8  # 8 was recommended 30 s ago
    assert hpa.scale(299.0, 8, _value(2.0)) == 8
    assert hpa.scale(300.0, 8, _value(2.0)) == 2  # the 8 is 300 s old: out of the window


def test_scale_up_is_limited_per_period_by_the_larger_of_pods_and_percent() -> None:
    hpa = Hpa(Behavior.kubernetes_default(), 1, 100)
    assert hpa.scale(0.0, 2, _value(40.0)) == 6  # max(2 + 4, 2 x 200 %) = 6
    assert hpa.scale(5.0, 6, _value(40.0)) == 6  # same 15 s period: still from 2
    assert hpa.scale(16.0, 6, _value(40.0)) == 12  # new period from 6: max(10, 12)


def test_select_min_takes_the_smaller_step_and_disabled_none() -> None:
    rules = Rules(tolerance=0.0, select=Select.MIN, policies=(
        StepPolicy(PolicyKind.PERCENT, 100), StepPolicy(PolicyKind.PODS, 1)))
    hpa = Hpa(Behavior(scale_up=rules, scale_down=Rules(tolerance=0.0)), 1, 100)
    assert hpa.scale(0.0, 4, _value(40.0)) == 5
    off = Behavior(scale_up=Rules(select=Select.DISABLED), scale_down=Rules(select=Select.DISABLED))
    assert Hpa(off, 1, 100).scale(0.0, 4, _value(40.0)) == 4


def test_scale_down_percent_floors_and_bounds_apply() -> None:
    behavior = Behavior(scale_up=Rules(tolerance=0.0),
                        scale_down=Rules(tolerance=0.0, policies=(
                            StepPolicy(PolicyKind.PERCENT, 50),)))
    hpa = Hpa(behavior, 2, 10)
    assert hpa.scale(0.0, 9, _value(1.0)) == 4  # int(9 x 0.5)
    assert hpa.scale(20.0, 4, _value(0.0)) == 2  # int(4 x 0.5) = 2, and min 2
    assert Hpa(FREE, 2, 10).scale(0.0, 5, _value(99.0)) == 10


def test_shipped_behaviour_applies_the_sizer_count_at_once() -> None:
    hpa = Hpa(Behavior.shipped(8), 1, 8)
    assert hpa.scale(0.0, 1, _value(8.0)) == 8
    assert hpa.scale(30.0, 8, _value(1.0)) == 1


def test_bad_bounds_and_target_are_refused() -> None:
    with pytest.raises(ValueError, match="0 <= min <= max"):
        Hpa(FREE, 3, 2)
    with pytest.raises(ValueError, match="target must be > 0"):
        Hpa(FREE, 1, 2).scale(0.0, 1, _value(1.0, target=0.0))
