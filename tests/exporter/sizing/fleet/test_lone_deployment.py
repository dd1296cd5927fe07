"""A lone single-variant deployment decides as the recommender does: same count for the same
demand and capacity, same scale-down stabilization, same bounds."""

from __future__ import annotations

from exporter.sizing.fleet.plan import FleetPlanner
from exporter.sizing.fleet.values import FleetInput, FleetModel, Variant
from exporter.sizing.recommender import Reason, Recommender
from tests.exporter.sizing.test_recommender import LLAMA, SHAPE, deployment, observation

# Rising, falling inside and beyond the 300 s window, past replicas.max (6) and back.
RATES = (3.0, 9.0, 17.5, 17.5, 30.0, 12.0, 12.0, 5.0, 5.0, 5.0, 70.0, 41.0, 8.06, 16.2, 0.4)


def test_a_lone_variant_gets_the_recommender_count_every_cycle() -> None:
    dep = deployment()
    recommender, planner = Recommender(dep), FleetPlanner()
    pods = 2
    seen: set[Reason] = set()
    for step, rate in enumerate(RATES * 3):
        now_s = 120.0 * step
        decision = recommender.decide(now_s, observation(rate, pods), LLAMA, SHAPE)
        assert decision.sizing_rate_rps is not None
        assert decision.max_rate_per_replica_rps is not None
        inp = FleetInput(
            models=(FleetModel(name="llama", demand_rps=decision.sizing_rate_rps),),
            variants=(
                Variant(
                    name="llama-h100",
                    model="llama",
                    accelerator="h100",
                    gpus_per_replica=1,
                    price_per_gpu_hour=4.0,
                    capacity_rps=decision.max_rate_per_replica_rps,
                    min_replicas=dep.min_replicas,
                    max_replicas=dep.max_replicas,
                    current_replicas=pods,
                    ready_replicas=pods,
                    stabilization_s=dep.scale_down_stabilization_s,
                ),
            ),
            inventory={"h100": dep.max_replicas},
        )
        plan = planner.decide(now_s, inp)
        assert plan.desired["llama-h100"] == decision.desired_replicas, (step, rate, decision)
        if decision.model_replicas is not None and decision.model_replicas <= dep.max_replicas:
            assert plan.target["llama-h100"] == decision.model_replicas
        assert decision.desired_replicas is not None
        pods = decision.desired_replicas
        seen.add(decision.reason)
    # The sequence exercises every rule a lone deployment's count follows.
    wanted = {Reason.SCALE_UP, Reason.SCALE_DOWN, Reason.STABILIZING, Reason.MAX_REPLICAS}
    assert wanted <= seen, seen
