"""The fleet decision: stability, make-before-break, stabilization, reasons, and properties
that hold on any fleet (hypothesis)."""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.sizing.fleet.evaluate import gpus_by_type
from exporter.sizing.fleet.plan import FleetPlanner
from exporter.sizing.fleet.values import FleetInput, FleetModel, PlanReason, Routing, Variant
from tests.exporter.sizing.fleet.instances import random_instance


def variant(name: str, model: str = "m", **fields: object) -> Variant:
    values: dict[str, object] = {
        "accelerator": "h100",
        "gpus_per_replica": 1,
        "price_per_gpu_hour": 4.0,
        "capacity_rps": 2.0,
        "max_replicas": 10,
        "stabilization_s": 0.0,
    }
    values.update(fields)
    return Variant(name=name, model=model, **values)  # type: ignore[arg-type]


def fleet(*variants: Variant, demand: float = 10.0, **fields: object) -> FleetInput:
    models = tuple(
        FleetModel(name=m, demand_rps=demand) for m in sorted({v.model for v in variants})
    )
    values: dict[str, object] = {"inventory": {"h100": 100, "a100": 100}}
    values.update(fields)
    return FleetInput(models=models, variants=variants, **values)  # type: ignore[arg-type]


def test_the_cheaper_variant_per_request_carries_the_load() -> None:
    # h100: 4 $/h for 2 req/s; a100: 2.5 $/h for 1.5 req/s (1.67 $/h per req/s, cheaper).
    plan = FleetPlanner().decide(
        0.0,
        fleet(
            variant("h"), variant("a", accelerator="a100", price_per_gpu_hour=2.5, capacity_rps=1.5)
        ),
    )
    # 7 a100 (17.5 $/h) beats 5 h100 (20) and every mix (2 h100 + 4 a100: 18).
    assert plan.target == {"h": 0, "a": 7}
    assert plan.reason is PlanReason.LEAST_COST
    assert plan.gpus_planned["a100"] * 2.5 + plan.gpus_planned["h100"] * 4.0 == plan.cost_per_hour


def test_even_routing_sizes_every_replica_for_the_slowest_in_use() -> None:
    fast = variant("fast", capacity_rps=4.0, price_per_gpu_hour=4.0, max_replicas=2)
    slow = variant("slow", accelerator="a100", capacity_rps=1.0, price_per_gpu_hour=1.2)
    weighted = FleetPlanner().decide(0.0, fleet(fast, slow, demand=9.0))
    # Weighted: two fast (8 req/s, 8 $/h) and one slow: 9.2 $/h, against 10.8 for slow alone.
    assert weighted.target == {"fast": 2, "slow": 1}
    inp = fleet(fast, slow, demand=9.0)
    even = replace(inp, models=(replace(inp.models[0], routing=Routing.EVEN),))
    plan = FleetPlanner().decide(0.0, even)
    # Mixed, every replica gets 9 / N <= 1 req/s: 9 replicas, so slow alone (10.8 $/h) is cheapest.
    assert plan.target == {"fast": 0, "slow": 9}
    assert plan.models["m"].unserved_rps == 0.0


def test_a_cheaper_mix_replaces_the_current_one_only_above_the_switch_share() -> None:
    # Running 5 h100 (20 $/h); a100 alone costs 2.5 x 7 = 17.5 $/h: saves 12.5 %.
    h = variant("h", current_replicas=5, ready_replicas=5)
    a = variant("a", accelerator="a100", price_per_gpu_hour=2.5, capacity_rps=1.5)
    kept = FleetPlanner().decide(0.0, fleet(h, a, switch_saving=0.2))
    assert kept.target == {"h": 5, "a": 0}
    assert kept.reason is PlanReason.KEPT_FOR_STABILITY
    switched = FleetPlanner().decide(0.0, fleet(h, a, switch_saving=0.1))
    assert switched.target == {"h": 0, "a": 7}
    assert switched.reason is PlanReason.LEAST_COST


def test_the_kept_mix_is_still_resized_for_the_demand() -> None:
    h = variant("h", current_replicas=5, ready_replicas=5)
    a = variant("a", accelerator="a100", price_per_gpu_hour=2.5, capacity_rps=1.5)
    plan = FleetPlanner().decide(0.0, fleet(h, a, demand=14.0, switch_saving=0.2))
    assert plan.target == {"h": 7, "a": 0}


def test_a_replaced_variant_keeps_its_replicas_until_the_replacement_is_ready() -> None:
    planner = FleetPlanner()
    h = variant("h", current_replicas=5, ready_replicas=5)
    a = variant("a", accelerator="a100", price_per_gpu_hour=2.5, capacity_rps=1.5)
    starting = planner.decide(0.0, fleet(h, a, switch_saving=0.1))
    assert starting.target == {"h": 0, "a": 7}
    assert starting.desired == {"h": 5, "a": 7}
    a_up = replace(a, current_replicas=7, ready_replicas=6)
    assert planner.decide(30.0, fleet(h, a_up, switch_saving=0.1)).desired["h"] == 5
    a_ready = replace(a, current_replicas=7, ready_replicas=7)
    assert planner.decide(60.0, fleet(h, a_ready, switch_saving=0.1)).desired == {"h": 0, "a": 7}


def test_make_before_break_never_exceeds_the_inventory() -> None:
    h = variant(
        "h", accelerator="a100", price_per_gpu_hour=4.0, current_replicas=5, ready_replicas=5
    )
    a = variant("a", accelerator="a100", price_per_gpu_hour=2.5, capacity_rps=1.5)
    plan = FleetPlanner().decide(0.0, fleet(h, a, inventory={"a100": 9}))
    assert plan.target == {"h": 0, "a": 7}
    assert plan.desired == {"h": 2, "a": 7}  # only 2 GPUs left to hold on to


def test_scale_down_is_held_by_each_variant_stabilization_window() -> None:
    planner = FleetPlanner()
    v = variant("h", stabilization_s=300.0)
    assert planner.decide(0.0, fleet(v, demand=10.0)).desired == {"h": 5}
    assert planner.decide(30.0, fleet(v, demand=4.0)).desired == {"h": 5}
    assert planner.decide(299.0, fleet(v, demand=4.0)).desired == {"h": 5}
    assert planner.decide(331.0, fleet(v, demand=4.0)).desired == {"h": 2}
    # A variant the plan empties goes to 0, not to the recommender's serving floor of 1.
    assert planner.decide(700.0, fleet(v, demand=0.0)).desired == {"h": 0}


def test_short_inventory_serves_the_higher_priority_first() -> None:
    low = variant("low", model="a", capacity_rps=1.0, price_per_gpu_hour=1.0)
    high = variant("high", model="b", capacity_rps=1.0, price_per_gpu_hour=5.0)
    models = (
        FleetModel(name="a", demand_rps=6.0, priority=0),
        FleetModel(name="b", demand_rps=6.0, priority=1),
    )
    inp = FleetInput(models=models, variants=(low, high), inventory={"h100": 8})
    plan = FleetPlanner().decide(0.0, inp)
    assert plan.target == {"low": 2, "high": 6}
    assert plan.unserved_rps == {"a": 4.0, "b": 0.0}
    assert plan.models["a"].reason is PlanReason.PRIORITY_LIMITED
    assert plan.reason is PlanReason.PRIORITY_LIMITED
    same = replace(inp, models=tuple(replace(m, priority=0) for m in models))
    # Same priority: the most demand served (8 req/s either way), then the least cost.
    plan = FleetPlanner().decide(0.0, same)
    assert plan.target == {"low": 6, "high": 2}
    assert plan.models["b"].reason is PlanReason.INVENTORY_LIMITED


def test_demand_beyond_every_maximum_is_reported_unserved() -> None:
    plan = FleetPlanner().decide(0.0, fleet(variant("h", max_replicas=3), demand=10.0))
    assert plan.target == {"h": 3}
    assert plan.unserved_rps == {"m": 4.0}
    assert plan.reason is PlanReason.MAX_REPLICAS


def test_an_untrusted_variant_counts_at_its_prior_less_the_margin() -> None:
    v = variant("h", trusted=False, capacity_rps=5.0, prior_capacity_rps=2.0)
    plan = FleetPlanner().decide(0.0, fleet(v, demand=6.0, untrusted_margin=0.25))
    assert plan.target == {"h": 4}  # 6 / (2 x 0.75)


instances = st.builds(
    lambda seed, limited: random_instance(random.Random(seed), limited=limited),
    st.integers(0, 2**32 - 1),
    st.booleans(),
)


def _with_current(inp: FleetInput, seed: int) -> FleetInput:
    rng = random.Random(seed)
    variants = []
    for v in inp.variants:
        current = rng.randint(0, v.max_replicas + 1)
        variants.append(
            replace(
                v,
                current_replicas=current,
                ready_replicas=rng.randint(0, current),
                stabilization_s=rng.choice((0.0, 60.0)),
            )
        )
    return replace(inp, variants=tuple(variants))


@settings(max_examples=60, deadline=None)
@given(instances, st.integers(0, 2**32 - 1))
def test_every_plan_keeps_inventory_and_bounds(inp: FleetInput, seed: int) -> None:
    planner = FleetPlanner()
    inp = _with_current(inp, seed)
    for step in range(3):
        plan = planner.decide(30.0 * step, inp)
        for counts in (plan.target, plan.desired):
            used = gpus_by_type(inp, counts)
            assert all(used[k] <= inp.inventory.get(k, 0) for k in used), (counts, inp.inventory)
            assert all(v.min_replicas <= counts[v.name] <= v.max_replicas for v in inp.variants)
        assert plan.gpus_planned == gpus_by_type(inp, plan.desired)
        inp = replace(
            inp, models=tuple(replace(m, demand_rps=m.demand_rps * 0.5) for m in inp.models)
        )


@settings(max_examples=60, deadline=None)
@given(instances, st.integers(0, 2**32 - 1))
def test_a_higher_priority_is_never_starved_for_a_lower_one(inp: FleetInput, seed: int) -> None:
    """With demand of a weighted model unserved, no lower-priority model holds GPUs above its
    minimum (nor are any free) that one more replica of one of its variants could use."""
    plan = FleetPlanner().decide(0.0, _with_current(inp, seed))
    used = gpus_by_type(inp, plan.target)
    for m in inp.models:
        if m.routing is not Routing.WEIGHTED or plan.unserved_rps[m.name] <= 0:
            continue
        lower = {o.name for o in inp.models if o.priority < m.priority}
        for v in inp.variants:
            if (
                v.model != m.name
                or plan.target[v.name] >= v.max_replicas
                or v.sizing_capacity_rps(inp.untrusted_margin) <= 0
            ):
                continue
            above_min = sum(
                (plan.target[w.name] - w.min_replicas) * w.gpus_per_replica
                for w in inp.variants
                if w.model in lower and w.accelerator == v.accelerator
            )
            free = inp.inventory.get(v.accelerator, 0) - used[v.accelerator]
            assert above_min + free < v.gpus_per_replica, (m.name, v.name, plan.target)


@settings(max_examples=40, deadline=None)
@given(instances, st.integers(0, 2**32 - 1))
def test_a_stationary_input_changes_the_plan_at_most_once(inp: FleetInput, seed: int) -> None:
    """The same input every cycle: the plan is the same every cycle, except that a cheaper mix
    held off until it pays back the replicas a switch strands is switched to once, and then
    kept."""
    planner = FleetPlanner()
    inp = _with_current(inp, seed)
    plans = [planner.decide(30.0 * step, inp).target for step in range(40)]
    changes = [k for k in range(1, len(plans)) if plans[k] != plans[k - 1]]
    assert len(changes) <= 1, changes


@settings(max_examples=25, deadline=None)
@given(instances)
def test_a_fleet_that_runs_its_plan_settles_and_stays(inp: FleetInput) -> None:
    """Fed its own counts back as running and ready, the plan stops changing once the
    stabilization windows have passed, and then never changes again."""
    planner = FleetPlanner()
    plans = []
    for step in range(20):
        plan = planner.decide(30.0 * step, inp)
        plans.append(plan.desired)
        inp = replace(
            inp,
            variants=tuple(
                replace(
                    v, current_replicas=plan.desired[v.name], ready_replicas=plan.desired[v.name]
                )
                for v in inp.variants
            ),
        )
    assert all(p == plans[-1] for p in plans[12:])
