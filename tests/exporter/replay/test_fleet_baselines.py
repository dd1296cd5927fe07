"""The fleet baselines against hand-computed plans."""

from __future__ import annotations

import pytest

from exporter.replay.fleet_baselines import (
    Offer,
    cheapest_single,
    greedy_kv,
    single_cost,
    single_peak,
)


def offer(name: str, model: str, kind: str, cost: float, kv: float, cap: float = 0.0,
          lo: int = 0, hi: int = 10, gpus: int = 1) -> Offer:
    return Offer(name=name, model=model, accelerator=kind, gpus=gpus, cost_per_replica_hour=cost,
                 kv_capacity_tokens=kv, capacity_rps=cap, min_replicas=lo, max_replicas=hi)


H100 = offer("a", "m", "H100", 4.0, 400_000)  # 1.0e-5 per KV token-hour
L40S = offer("b", "m", "L40S", 1.0, 200_000)  # 0.5e-5: the cheaper capacity


def test_greedy_fills_the_cheapest_kv_capacity_first_then_the_next() -> None:
    # 500k tokens at fill 0.8: L40S holds 160k each, 4 would do; only 2 GPUs: 320k there,
    # the 180k left on H100 (320k each): 1.
    counts = greedy_kv({"m": 500_000}, [H100, L40S], {"H100": 8, "L40S": 2}, {"m": 0})
    assert counts == {"a": 1, "b": 2}
    # With room, all on L40S: ceil(500 / 160) = 4.
    assert greedy_kv({"m": 500_000}, [H100, L40S], {"H100": 8, "L40S": 8}, {"m": 0}) == {
        "a": 0, "b": 4}


def test_greedy_serves_the_higher_priority_model_first() -> None:
    hi_b = offer("hi-b", "hi", "L40S", 1.0, 200_000)
    lo_b = offer("lo-b", "lo", "L40S", 1.0, 200_000)
    lo_a = offer("lo-a", "lo", "H100", 4.0, 400_000)
    counts = greedy_kv({"hi": 300_000, "lo": 500_000}, [lo_a, lo_b, hi_b],
                       {"L40S": 3, "H100": 1}, {"hi": 1, "lo": 0})
    # hi: ceil(300 / 160) = 2 L40S; lo: the last L40S (160k), 340k left, H100 capped at 1.
    assert counts == {"hi-b": 2, "lo-b": 1, "lo-a": 1}


def test_greedy_counts_minimums_and_respects_max() -> None:
    floor = offer("a", "m", "H100", 4.0, 400_000, lo=1)
    capped = offer("b", "m", "L40S", 1.0, 200_000, hi=1)
    # The H100 minimum holds 320k; 180k left: 1 L40S (max 1) holds 160k; 20k left: 1 H100.
    assert greedy_kv({"m": 500_000}, [floor, capped], {"H100": 4, "L40S": 4}, {"m": 0}) == {
        "a": 2, "b": 1}


def test_single_cost_is_replicas_per_window_times_price() -> None:
    fast = offer("a", "m", "H100", 4.0, 1.0, cap=10.0)
    assert single_cost([10.0, 20.0, 10.0], fast, {"H100": 8}, 3600.0) == (0.0, 16.0)


def test_cheapest_single_is_the_cheapest_that_carries_every_window() -> None:
    fast = offer("a", "m", "H100", 4.0, 1.0, cap=10.0)  # 1, 2, 1 replicas: 16
    slow = offer("b", "m", "L40S", 1.0, 1.0, cap=3.0)  # 4, 7, 4 replicas: 15
    demand = [10.0, 20.0, 10.0]
    assert cheapest_single(demand, [fast, slow], {"H100": 8, "L40S": 8}, 3600.0) == "b"
    # With 6 L40S the middle window is 2 req/s short: the carrying one wins at any price.
    assert cheapest_single(demand, [fast, slow], {"H100": 8, "L40S": 6}, 3600.0) == "a"
    short, cost = single_cost(demand, slow, {"L40S": 6}, 3600.0)
    assert short == pytest.approx(2.0 * 3600.0) and cost == pytest.approx(14.0)
    with pytest.raises(ValueError, match="offers"):
        cheapest_single(demand, [], {}, 30.0)


def test_single_peak_is_the_busiest_windows_count_within_the_inventory() -> None:
    fast = offer("a", "m", "H100", 4.0, 1.0, cap=10.0)
    assert single_peak([10.0, 25.0, 5.0], fast, {"H100": 8}) == 3
    assert single_peak([10.0, 25.0, 5.0], fast, {"H100": 2}) == 2
