"""The replay engine against the closed-loop bench's own loop, and the exposition observer
against the simulator's truth, on the first ten minutes of the paper's profile (one ramp)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.closed_loop import FLEET, SCENARIOS, Arm, run_arm
from exporter.replay.arrivals import DrawnArrivals
from exporter.replay.engine import ApplyAsIs, Engine, FleetSettings
from exporter.replay.engine import Arm as EngineArm
from exporter.replay.exposition import ExpositionObserver, PerfectObserver
from exporter.replay.perfect import KV_CAPACITY_TOKENS, observe_window
from exporter.replay.policies import FixedPolicy, ThroughputPolicy
from model.simulation.simulator import Simulator
from model.simulation.workloads import LengthDist, LengthKind, RateProfile, draw_trace

SHORT_S = 600.0
SEED = 7


def _trace(scenario_name: str = "ttft-bound") -> tuple[RateProfile, object]:
    scenario = next(s for s in SCENARIOS if s.name == scenario_name)
    profile = RateProfile.paper(scenario.base_rps)
    trace = draw_trace(
        profile,
        LengthDist(LengthKind(scenario.lengths), scenario.input_tokens, scenario.length_cv),
        LengthDist(LengthKind(scenario.lengths), scenario.output_tokens, scenario.length_cv),
        np.random.default_rng(SEED),
        duration_s=SHORT_S,
    )
    return profile, trace


def _reference_throughput_run() -> list[tuple[int, int, float | None, float | None, int]]:
    """The bench's loop as it was before the engine: the whole trace offered at once, one
    window at a time, the perfect collector on the whole result, the count applied as is."""
    profile, trace = _trace()
    sim = Simulator(FLEET.params, FLEET.server, replicas=1, kv_capacity_tokens=KV_CAPACITY_TOKENS,
                    startup_delay_s=FLEET.startup_delay_s, max_jump_s=FLEET.max_jump_s,
                    record_iterations=True)
    sim.add_requests(trace)  # type: ignore[arg-type]
    policy = ThroughputPolicy(KV_CAPACITY_TOKENS, 10)
    provisioned, status, out = 1, sim.replica_status(), []
    for k in range(int(SHORT_S // FLEET.window_s)):
        t0, t1 = k * FLEET.window_s, (k + 1) * FLEET.window_s
        samples = []
        for j in range(1, 31):
            sim.run(t0 + j * 1.0)
            samples.append(sim.replica_status())
        view = observe_window(sim.result(), t0, t1, status, samples, records=sim.drain_records())
        status = samples[-1]
        desired = math.ceil(policy.decide(view, t1, provisioned).value)
        obs = view.observation
        out.append((provisioned, desired, obs.ttft_ms, obs.itl_ms, view.peak_waiting))
        sim.set_replicas(desired)
        provisioned = desired
    return out


def test_engine_reproduces_the_former_bench_loop_exactly() -> None:
    profile, trace = _trace()
    engine = Engine(FLEET, [EngineArm(ThroughputPolicy(KV_CAPACITY_TOKENS, 10),
                                      PerfectObserver(kv_capacity_tokens=KV_CAPACITY_TOKENS),
                                      ApplyAsIs())])
    got = []
    for step in engine.steps(DrawnArrivals(trace, None), SHORT_S):  # type: ignore[arg-type]
        w = step.arms[0]
        obs = w.view.observation
        got.append((w.provisioned, w.desired, obs.ttft_ms, obs.itl_ms, w.view.peak_waiting))
    reference = _reference_throughput_run()
    assert len(got) == 20
    assert got == reference  # bit for bit: same floats, same counts
    assert max(r[0] for r in reference) > 1  # the ramp made it scale: the test saw decisions


def test_bench_run_is_deterministic_per_seed() -> None:
    scenario = next(s for s in SCENARIOS if s.name == "ttft-bound")
    first = run_arm(scenario, Arm.QUEUEING, SEED, SHORT_S)
    again = run_arm(scenario, Arm.QUEUEING, SEED, SHORT_S)
    assert first.cycles == again.cycles and len(first.cycles) == 20
    assert first.params == again.params


def test_the_exposition_path_reads_what_the_simulator_did() -> None:
    """The collector's histogram means are exact sums over counts: the TTFT of the first
    tokens in a window and the completions agree with the simulator's own, window by window,
    once a pod has two reads."""
    profile, trace = _trace()
    fleet = FleetSettings(params=FLEET.params, server=FLEET.server,
                          kv_capacity_tokens=KV_CAPACITY_TOKENS, startup_delay_s=90.0,
                          window_s=30.0)
    arms = [
        EngineArm(FixedPolicy(2, name="perfect"),
                  PerfectObserver(kv_capacity_tokens=KV_CAPACITY_TOKENS), ApplyAsIs(), 2),
        EngineArm(FixedPolicy(2, name="exposition"),
                  ExpositionObserver(model_name="llama", kv_capacity_tokens=KV_CAPACITY_TOKENS),
                  ApplyAsIs(), 2),
    ]
    checked = 0
    for step in Engine(fleet, arms).steps(DrawnArrivals(trace, None), SHORT_S):  # type: ignore[arg-type]
        truth, read = (w.view.observation for w in step.arms)
        assert step.arms[0].view.peak_waiting == step.arms[1].view.peak_waiting
        if step.index == 0:
            assert read.status.value == "warming_up"  # one read per pod so far
            continue
        assert read.ready_pods == truth.ready_pods == 2
        assert read.completion_rate_rps == pytest.approx(truth.completion_rate_rps, rel=1e-12)
        if truth.ttft_ms is not None:
            assert read.ttft_ms == pytest.approx(truth.ttft_ms, rel=1e-9)
            checked += 1
    assert checked >= 15
