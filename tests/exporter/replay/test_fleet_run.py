"""Fleet replay: setup parsing, scoring arithmetic, and the policies on a small fleet."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from exporter.base.errors import ConfigError
from exporter.replay.fleet_policies import FleetDecision, ModelWindow
from exporter.replay.fleet_run import (
    PolicyScore,
    best_single_variants,
    fleet_json,
    fleet_table,
    run_policy,
    standard_policies,
)
from exporter.replay.fleet_setup import FleetSetup, is_fleet_config, load_fleet
from model.simulation.workloads import LengthDist, LengthKind, RequestTrace, poisson_trace

FLEET = """
fleet:
  window_s: 30
  accelerators:
    H100: {price_per_gpu_hour: 4.0, inventory: 2}
    L40S: {price_per_gpu_hour: 1.0, inventory: 8}
  models:
    - name: chat
      truth_model: llama-3.1-8b
      slo: {ttft_ms: 1000, itl_ms: 60}
      variants:
        - {name: chat-h100, accelerator: H100, max: 2, initial: 1}
        - {name: chat-l40s, accelerator: L40S, max: 8}
"""


def setup_of(tmp_path: Path, text: str = FLEET) -> FleetSetup:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    assert is_fleet_config(path)
    return load_fleet(path)


def trace(rate: float, seconds: float, seed: int = 0) -> RequestTrace:
    return poisson_trace(rate, seconds, LengthDist(LengthKind.UNIFORM, 512),
                         LengthDist(LengthKind.UNIFORM, 128), np.random.default_rng(seed))


def test_the_setup_carries_truths_prices_and_inventory(tmp_path: Path) -> None:
    setup = setup_of(tmp_path)
    h100, l40s = setup.variants
    assert (h100.initial, l40s.initial, l40s.min_replicas) == (1, 0, 0)
    assert setup.cost_per_replica_hour(h100) == 4.0
    assert h100.truth.params.alpha_ms == pytest.approx(6.68)
    assert setup.judged_from_s == 30.0 + h100.truth.startup_delay_s


def test_every_bad_key_is_named(tmp_path: Path) -> None:
    bad = FLEET.replace("inventory: 2", "inventory: -1").replace("itl_ms: 60", "itl_ms: 0")
    bad = bad.replace("accelerator: L40S", "accelerator: A100")
    with pytest.raises(ConfigError) as err:
        setup_of(tmp_path, bad)
    text = str(err.value)
    assert "fleet.accelerators.H100.inventory" in text
    assert "fleet.models[0].slo.itl_ms" in text
    assert "fleet.models[0].variants[1].accelerator" in text


class Fixed:
    """A policy that asks for fixed counts, alternating when given two."""

    def __init__(self, *plans: Mapping[str, int]) -> None:
        self.name = "fixed"
        self.plans = plans
        self.k = 0

    def decide(self, now_s: float, windows: Mapping[str, ModelWindow]) -> FleetDecision:
        plan = self.plans[self.k % len(self.plans)]
        self.k += 1
        return FleetDecision(counts=plan, weights={k: float(v) for k, v in plan.items()})


def test_cost_replica_hours_changes_and_inventory_are_counted(tmp_path: Path) -> None:
    setup = setup_of(tmp_path)
    traces = {"chat": trace(2.0, 300.0)}
    # Asks 3 H100 (inventory 2) every other window.
    score = run_policy(setup, Fixed({"chat-h100": 1, "chat-l40s": 1},
                                    {"chat-h100": 3, "chat-l40s": 0}), traces, 10)
    # Window 0 runs the initial 1 H100; then plans alternate, starting with the first.
    h100 = [1, 1, 3, 1, 3, 1, 3, 1, 3, 1]
    l40s = [0, 1, 0, 1, 0, 1, 0, 1, 0, 1]
    assert score.series["chat-h100"] == h100 and score.series["chat-l40s"] == l40s
    assert score.replica_hours["chat-h100"] == pytest.approx(sum(h100) * 30 / 3600)
    assert score.cost == pytest.approx((4 * sum(h100) + sum(l40s)) * 30 / 3600)
    assert score.inventory_violations == 4
    assert score.plan_changes == 9
    assert score.judged["chat"] == 10 - 5  # judged from 30 + 92 s: windows starting at 150 s


def test_the_standard_policies_on_a_small_fleet(tmp_path: Path) -> None:
    setup = setup_of(tmp_path)
    traces = {"chat": trace(6.0, 900.0)}
    windows = 30
    assert best_single_variants(setup, traces, windows) == {"chat": "chat-l40s"}
    scores = [run_policy(setup, p, traces, windows)
              for p in standard_policies(setup, traces, windows)]
    by = {s.name: s for s in scores}
    assert list(by) == ["ours", "best_single", "greedy_kv", "oracle", "oracle_foresight"]
    assert by["oracle"].met_share >= 0.95
    assert by["best_single"].replica_hours["chat-h100"] <= 1 * (setup.judged_from_s / 3600 + 0.1)
    for s in scores:
        assert s.inventory_violations == 0, s.name
    report = fleet_json(setup, scores, windows)
    assert set(report["policies"]["ours"]) >= {"cost", "replica_hours", "met_windows",
                                                "plan_changes", "inventory_violations",
                                                "unserved_requests"}
    assert fleet_table(setup, scores).count("\n") == 2 + len(scores)


def test_replay_cli_runs_a_fleet_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    from exporter.cli.main import main

    config = tmp_path / "fleet.yaml"
    config.write_text(FLEET)
    rows = "\n".join(f'{{"timestamp": {int(k * 500)}, "input_length": 300, "output_length": 50}}'
                     for k in range(600))
    trace_file = tmp_path / "trace.jsonl"
    trace_file.write_text(rows + "\n")
    out = tmp_path / "out"
    assert main(["replay", "--config", str(config), "--trace", str(trace_file),
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| ours |" in text and "| oracle |" in text and "| greedy_kv |" in text
    assert (out / "fleet.json").exists()
    png = (out / "fleet.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    bad = tmp_path / "bad.yaml"
    bad.write_text(FLEET.replace("window_s: 30", "window_s: -1"))
    assert main(["replay", "--config", str(bad), "--trace", str(trace_file)]) == 2
    assert "fleet.window_s" in capsys.readouterr().err


def test_greedy_kv_holds_its_counts_for_the_stabilization_window(tmp_path: Path) -> None:
    from exporter.replay.fleet_policies import GreedyKvPolicy, VariantWindow
    from model.queueing.params import Workload

    setup = setup_of(tmp_path)
    policy = GreedyKvPolicy(setup, stabilization_s=90.0)
    idle = {"chat-h100": VariantWindow(asked=1, ready=1, observation=None),
            "chat-l40s": VariantWindow(asked=0, ready=0, observation=None)}

    def window(in_flight: int) -> dict[str, ModelWindow]:
        return {"chat": ModelWindow(demand_rps=1.0, workload=Workload(1000, 200),
                                    in_flight=in_flight, variants=idle)}

    # 1100 tokens per request in flight; an L40S holds 0.8 x 207,061: 150 per replica.
    busy = policy.decide(30.0, window(600)).counts
    assert busy == {"chat-h100": 0, "chat-l40s": 4}
    assert policy.decide(60.0, window(10)).counts == busy  # within 90 s: held
    assert policy.decide(110.0, window(10)).counts == busy
    assert policy.decide(150.0, window(10)).counts == {"chat-h100": 0, "chat-l40s": 1}


def test_best_single_leaves_the_scarce_type_to_the_higher_priority_model(tmp_path: Path) -> None:
    two = FLEET.replace("""    - name: chat
      truth_model: llama-3.1-8b""", """    - name: chat
      truth_model: llama-3.1-8b
      priority: 1
      share: 0.5""") + """    - name: other
      truth_model: llama-3.1-8b
      share: 0.5
      slo: {ttft_ms: 1000, itl_ms: 60}
      variants:
        - {name: other-h100, accelerator: H100, max: 2}
        - {name: other-l40s, accelerator: L40S, max: 8}
"""
    two = two.replace("H100: {price_per_gpu_hour: 4.0, inventory: 2}",
                      "H100: {price_per_gpu_hour: 0.5, inventory: 1}")
    setup = setup_of(tmp_path, two)
    traces = {"chat": trace(2.0, 300.0), "other": trace(2.0, 300.0, seed=1)}
    # H100 is now the cheapest; chat (priority 1) takes the one there is, other goes to L40S.
    assert best_single_variants(setup, traces, 10) == {"chat": "chat-h100",
                                                       "other": "other-l40s"}


def test_the_oracle_with_foresight_scales_up_before_the_step(tmp_path: Path) -> None:
    from exporter.replay.fleet_policies import PlannerPolicy, TrueEstimates

    setup = setup_of(tmp_path)
    # One H100 carries about 48 req/s of these lengths; the step's 48 req/s (60 planned with
    # the margin) needs a second replica. (The running H100 is kept on the low rate: the
    # L40S mix would pay back the H100 it strands only after 7 minutes.)
    low, high = trace(1.0, 300.0), trace(48.0, 300.0, seed=1)
    step = RequestTrace(np.concatenate([low.arrival_s, high.arrival_s + 300.0]),
                        np.concatenate([low.input_tokens, high.input_tokens]),
                        np.concatenate([low.output_tokens, high.output_tokens]))
    traces = {"chat": step}
    plain = run_policy(setup, PlannerPolicy("oracle", setup, TrueEstimates()), traces, 20)
    ahead = run_policy(setup, PlannerPolicy("oracle_foresight", setup, TrueEstimates(),
                                            foresight=True), traces, 20)

    def replicas(score: PolicyScore, k: int) -> int:
        return sum(score.series[v.name][k] for v in setup.variants)

    # Window 8 runs what was asked at 240 s: foresight already sees the step at 300 s.
    assert replicas(ahead, 8) > replicas(plain, 8)
    assert replicas(ahead, 15) == replicas(plain, 15)  # on the plateau both plan the same


def test_ours_records_when_each_variant_is_trusted_after_its_first_ready_replica(
    tmp_path: Path,
) -> None:
    """Ours' trust record: the L40S (no replica at first, made cheap here so the plan adds
    one) is trusted on the calibration confidence within 10 minutes of 30 s cycles after its
    first replica is ready; its prior's capacity error is recorded then."""
    from exporter.replay.fleet_policies import PlannerPolicy, TunerEstimates

    setup = setup_of(tmp_path, FLEET.replace("L40S: {price_per_gpu_hour: 1.0",
                                             "L40S: {price_per_gpu_hour: 0.2"))
    ours = PlannerPolicy("ours", setup, TunerEstimates(setup))
    run_policy(setup, ours, {"chat": trace(8.0, 1500.0)}, 50)
    record = ours.trust["chat-l40s"]
    assert record.ready_s > 30.0  # it started at 0 replicas
    assert record.trusted_s is not None and record.trusted_s - record.ready_s <= 600.0
    assert record.prior_vs_truth is not None and abs(record.prior_vs_truth) < 0.5
    assert record.prior_vs_own is not None
