"""Mixed fleets: routing across unequal replicas, per-variant truths, delays and KV limits."""

from __future__ import annotations

import numpy as np
import pytest

from model.queueing.analyzer import max_rate
from model.queueing.params import ServerConfig, ServiceParams, Workload
from model.simulation.mixed import FleetRouting, MixedSimulator, VariantSpec
from model.simulation.replica import ReplicaState
from model.simulation.simulator import Router, simulate
from model.simulation.workloads import LengthDist, LengthKind, RequestTrace, poisson_trace

SLOW = ServiceParams(alpha_ms=10.0, beta_ms=4e-2, gamma_ms=1e-4)
FAST = ServiceParams(alpha_ms=5.0, beta_ms=2e-2, gamma_ms=5e-5)  # every cost halved: 2x speed
SERVER = ServerConfig(32, 512)
KV = 10**6
N_IN, N_OUT = 256, 128


def variants(delay_fast_s: float = 0.0, delay_slow_s: float = 0.0) -> list[VariantSpec]:
    return [
        VariantSpec(name="fast", params=FAST, server=SERVER, kv_capacity_tokens=KV,
                    startup_delay_s=delay_fast_s),
        VariantSpec(name="slow", params=SLOW, server=SERVER, kv_capacity_tokens=KV,
                    startup_delay_s=delay_slow_s),
    ]  # fmt: skip


def shares_at_80_percent(routing: FleetRouting, seed: int) -> np.ndarray:
    """Each replica's share of the arrivals, 2 fast + 2 slow replicas at 80 % of capacity."""
    workload = Workload(N_IN, N_OUT)
    capacity = 2 * max_rate(FAST, SERVER, workload) + 2 * max_rate(SLOW, SERVER, workload)
    sim = MixedSimulator(variants(), routing=routing, replicas={"fast": 2, "slow": 2},
                         weights={"fast": 2.0, "slow": 1.0})
    duration_s = 240.0
    trace = poisson_trace(0.8 * capacity, duration_s, LengthDist(LengthKind.UNIFORM, N_IN),
                          LengthDist(LengthKind.UNIFORM, N_OUT), np.random.default_rng(seed))
    sim.add_requests(trace)
    result = sim.run(duration_s)
    assert sim.replica_variants() == ["fast", "fast", "slow", "slow"]
    counts = np.bincount(result.replica, minlength=4)
    return counts / counts.sum()


@pytest.mark.parametrize("seed", [0, 1])
def test_least_loaded_gives_each_replica_a_rate_proportional_to_its_speed(seed: int) -> None:
    share = shares_at_80_percent(FleetRouting.LEAST_LOADED, seed)
    proportional = np.array([2, 2, 1, 1]) / 6
    assert np.all(np.abs(share / proportional - 1.0) <= 0.10), share


def test_even_gives_every_replica_the_same_rate() -> None:
    share = shares_at_80_percent(FleetRouting.EVEN, 0)
    assert np.all(np.abs(share - 0.25) <= 1e-3), share


def test_weighted_splits_by_the_planned_rate_then_round_robin_within_a_variant() -> None:
    share = shares_at_80_percent(FleetRouting.WEIGHTED, 0)
    assert np.all(np.abs(share - np.array([1, 1, 0.5, 0.5]) / 3) <= 1e-3), share


def _burst(n: int, gap_s: float = 0.01, n_in: int = 8, n_out: int = 2) -> RequestTrace:
    return RequestTrace(np.arange(n) * gap_s, np.full(n, n_in), np.full(n, n_out))


def test_weighted_is_within_one_pick_of_the_weights_and_skips_weight_zero() -> None:
    sim = MixedSimulator(variants(), routing=FleetRouting.WEIGHTED,
                         replicas={"fast": 1, "slow": 1}, weights={"fast": 3.0, "slow": 1.0})
    sim.add_requests(_burst(40))
    result = sim.run()
    picks = result.replica
    for k in range(1, 41):
        fast = int(np.count_nonzero(picks[:k] == 0))
        assert abs(fast - 0.75 * k) < 1.0, (k, fast)
    sim.set_weights({"slow": 1.0})  # fast not named: 0
    sim.add_requests(RequestTrace(np.arange(10) * 0.01 + sim.now_s + 1.0, np.full(10, 8),
                                  np.full(10, 2)))
    after = sim.run().replica[40:]
    assert np.all(after == 1)


def test_weighted_with_no_weighted_variant_ready_uses_every_ready_replica() -> None:
    sim = MixedSimulator(variants(), routing=FleetRouting.WEIGHTED,
                         replicas={"fast": 1, "slow": 1}, weights={"fast": 1.0})
    sim.set_variant_replicas("fast", 0)  # idle: removed at once
    sim.add_requests(_burst(4))
    assert np.all(sim.run().replica == 1)


def test_a_single_variant_fleet_matches_the_single_variant_simulator() -> None:
    trace = poisson_trace(30.0, 60.0, LengthDist(LengthKind.UNIFORM, N_IN),
                          LengthDist(LengthKind.UNIFORM, N_OUT), np.random.default_rng(3))
    spec = [VariantSpec(name="only", params=SLOW, server=SERVER, kv_capacity_tokens=KV)]
    for routing, router in ((FleetRouting.EVEN, Router.ROUND_ROBIN),
                            (FleetRouting.LEAST_LOADED, Router.LEAST_LOADED)):
        mixed = MixedSimulator(spec, routing=routing, replicas={"only": 3})
        mixed.add_requests(trace)
        got = mixed.run()
        want = simulate(SLOW, SERVER, trace, replicas=3, router=router, kv_capacity_tokens=KV)
        np.testing.assert_array_equal(got.replica, want.replica)
        np.testing.assert_allclose(got.e2e_ms, want.e2e_ms)


def test_each_variant_starts_after_its_own_delay() -> None:
    sim = MixedSimulator(variants(delay_fast_s=5.0, delay_slow_s=50.0),
                         routing=FleetRouting.LEAST_LOADED)
    sim.set_counts({"fast": 1, "slow": 1})
    sim.advance(4.9)
    assert sim.counts((ReplicaState.READY,)) == {"fast": 0, "slow": 0}
    sim.advance(5.0)
    assert sim.counts((ReplicaState.READY,)) == {"fast": 1, "slow": 0}
    sim.advance(50.0)
    assert sim.counts((ReplicaState.READY,)) == {"fast": 1, "slow": 1}
    assert sim.counts() == {"fast": 1, "slow": 1}


def test_requests_wait_for_the_first_ready_variant() -> None:
    sim = MixedSimulator(variants(delay_fast_s=5.0, delay_slow_s=50.0),
                         routing=FleetRouting.EVEN)
    sim.set_counts({"fast": 1, "slow": 1})
    sim.add_requests(_burst(3))
    result = sim.run(20.0)
    assert np.all(result.replica == 0)  # only fast was ready when they were dispatched
    assert np.all(result.ttft_ms > 4900.0)


def test_scaling_one_variant_drains_only_its_replicas() -> None:
    sim = MixedSimulator(variants(), routing=FleetRouting.LEAST_LOADED,
                         replicas={"fast": 2, "slow": 2})
    sim.add_requests(_burst(8, gap_s=0.0, n_in=64, n_out=50))
    sim.advance(0.001)
    sim.set_variant_replicas("slow", 1)
    states = [s.state for s in sim.replica_status()]
    assert states[:2] == [ReplicaState.READY, ReplicaState.READY]
    assert sorted(states[2:]) == sorted([ReplicaState.READY, ReplicaState.DRAINING])
    result = sim.run()
    assert result.completed == 8  # the drained replica finished what it held
    assert sim.counts() == {"fast": 2, "slow": 1}


def test_a_request_beyond_its_replicas_kv_capacity_is_rejected_there() -> None:
    small = [VariantSpec(name="small", params=FAST, server=SERVER, kv_capacity_tokens=100),
             VariantSpec(name="big", params=SLOW, server=SERVER, kv_capacity_tokens=KV)]
    sim = MixedSimulator(small, routing=FleetRouting.EVEN, replicas={"small": 1, "big": 1})
    sim.add_requests(RequestTrace(np.array([0.0, 0.1]), np.array([200, 200]), np.array([2, 2])))
    result = sim.run()
    assert result.rejected == 1
    assert result.replica.tolist() == [0, 1]
    assert np.isnan(result.finish_s[0]) and not np.isnan(result.finish_s[1])


def test_bad_inputs_name_the_key() -> None:
    with pytest.raises(ValueError, match="variant names must be unique"):
        MixedSimulator(variants() + variants())
    sim = MixedSimulator(variants())
    with pytest.raises(ValueError, match="no variant named 'h100'"):
        sim.set_variant_replicas("h100", 1)
    with pytest.raises(ValueError, match="weights.fast"):
        sim.set_weights({"fast": -1.0})
    with pytest.raises(ValueError, match="set_variant_replicas"):
        sim.set_replicas(2)
