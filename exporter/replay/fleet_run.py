"""A fleet replay: each policy's mixed fleets driven window by window on the same arrivals.

Each policy runs its own `MixedSimulator` per model (the models share the GPU inventory through
the plan, not replicas). At each window's end every model's window is measured (the simulator's
own figures: a perfect collector), the policy decides replicas per variant, and the fleets
follow (new replicas after their variant's startup delay, removed ones drain).

Scoring, per policy: cost is the replicas asked for during each window times their price;
a judged window (from the setup's `judged_from_s`) meets a model's targets when the mean TTFT of
its first tokens in the window and the mean ITL (per-request time per output token) of its
requests finished in the window are within them (arrivals but no first token: missed);
plan changes are decisions that differ from the one before; an inventory violation is a window
whose asked-for GPUs of some type exceed the inventory; unserved demand is what the plan
reported unserved (req) plus the requests the fleet rejected.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from exporter.replay.fleet_baselines import Offer, cheapest_single, single_peak
from exporter.replay.fleet_policies import (
    Capacities,
    FleetPolicy,
    GreedyKvPolicy,
    ModelWindow,
    PlannerPolicy,
    TrueEstimates,
    TunerEstimates,
    VariantWindow,
)
from exporter.replay.fleet_setup import FleetSetup
from model.calibration.observation import Observation
from model.queueing.params import Workload
from model.simulation.mixed import FleetRouting, MixedSimulator
from model.simulation.replica import ReplicaState
from model.simulation.workloads import RequestTrace

MIN_OBSERVED = 5  # requests a variant's window needs before its tuner reads it
_HELD = (ReplicaState.STARTING, ReplicaState.READY, ReplicaState.DRAINING)


@dataclass(slots=True)
class PolicyScore:
    """One policy's totals over a fleet replay."""

    name: str
    cost: float = 0.0
    replica_hours: dict[str, float] = field(default_factory=dict)
    judged: dict[str, int] = field(default_factory=dict)
    met: dict[str, int] = field(default_factory=dict)
    plan_changes: int = 0
    plan_changes_after_warmup: int = 0
    inventory_violations: int = 0
    gpus_held_over_inventory: int = 0  # windows where draining replicas push past it
    unserved_requests: dict[str, float] = field(default_factory=dict)
    rejected: dict[str, int] = field(default_factory=dict)
    series: dict[str, list[Any]] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def met_share(self) -> float:
        judged = sum(self.judged.values())
        return sum(self.met.values()) / judged if judged else float("nan")

    def summary(self) -> dict[str, Any]:
        return {
            "cost": self.cost,
            "replica_hours": self.replica_hours,
            "judged_windows": self.judged,
            "met_windows": self.met,
            "met_share": self.met_share,
            "plan_changes": self.plan_changes,
            "plan_changes_after_warmup": self.plan_changes_after_warmup,
            "inventory_violations": self.inventory_violations,
            "gpus_held_over_inventory_windows": self.gpus_held_over_inventory,
            "unserved_requests": self.unserved_requests,
            "rejected_requests": self.rejected,
            "wall_s": self.wall_s,
        }


def window_counts(trace: RequestTrace, window_s: float, windows: int) -> np.ndarray:
    """Arrivals per window."""
    k = np.minimum((trace.arrival_s // window_s).astype(np.int64), windows - 1)
    return np.bincount(k[trace.arrival_s < windows * window_s], minlength=windows)


def run_policy(setup: FleetSetup, policy: FleetPolicy, traces: Mapping[str, RequestTrace],
               windows: int) -> PolicyScore:
    """Replay `windows` windows of `traces` (per model) under `policy`."""
    began = time.process_time()
    w_s = setup.window_s
    sims = {
        m.name: MixedSimulator([v.spec for v in m.variants], routing=m.gateway,
                               replicas={v.name: v.initial for v in m.variants}, max_jump_s=1.0)
        for m in setup.models
    }
    rates = {name: window_counts(tr, w_s, windows) / w_s for name, tr in traces.items()}
    cursor = dict.fromkeys(traces, 0)
    score = PolicyScore(policy.name, replica_hours={v.name: 0.0 for v in setup.variants},
                        judged={m.name: 0 for m in setup.models},
                        met={m.name: 0 for m in setup.models},
                        unserved_requests={m.name: 0.0 for m in setup.models})
    score.series = {"cost_per_hour": [], **{v.name: [] for v in setup.variants},
                    **{f"{m.name}:ttft_ms": [] for m in setup.models},
                    **{f"{m.name}:itl_ms": [] for m in setup.models}}
    asked = {v.name: v.initial for v in setup.variants}
    last: dict[str, int] | None = None
    for k in range(windows):
        start, end = k * w_s, (k + 1) * w_s
        for m in setup.models:
            tr = traces[m.name]
            stop = int(np.searchsorted(tr.arrival_s, end, side="right"))
            if stop > cursor[m.name]:
                sl = slice(cursor[m.name], stop)
                sims[m.name].add_requests(RequestTrace(tr.arrival_s[sl], tr.input_tokens[sl],
                                                       tr.output_tokens[sl]))
                cursor[m.name] = stop
            sims[m.name].advance(end)
        _charge(setup, score, asked, w_s)
        _check_inventory(setup, score, sims, asked)
        seen = {}
        for m in setup.models:
            window, ttft, itl = _measure(sims[m.name], start, end, setup, m.name,
                                         rates[m.name], k)
            seen[m.name] = window
            score.series[f"{m.name}:ttft_ms"].append(ttft)
            score.series[f"{m.name}:itl_ms"].append(itl)
            if start >= setup.judged_from_s - 1e-9:
                score.judged[m.name] += 1
                score.met[m.name] += int(ttft <= m.ttft_ms and itl <= m.itl_ms)
        decision = policy.decide(end, seen)
        asked = {v.name: int(decision.counts[v.name]) for v in setup.variants}
        for name, rps in decision.unserved_rps.items():
            score.unserved_requests[name] += rps * w_s
        if last is not None and asked != last:
            score.plan_changes += 1
            score.plan_changes_after_warmup += int(end >= setup.judged_from_s)
        last = dict(asked)
        for m in setup.models:
            sims[m.name].set_counts({v.name: asked[v.name] for v in m.variants})
            if m.gateway is FleetRouting.WEIGHTED:
                sims[m.name].set_weights({v.name: decision.weights.get(v.name, 0.0)
                                          for v in m.variants})
    for m in setup.models:
        t = sims[m.name].requests
        score.rejected[m.name] = int(t.rejected[: t.size].sum())
    score.wall_s = time.process_time() - began
    return score


def _charge(setup: FleetSetup, score: PolicyScore, asked: Mapping[str, int], w_s: float) -> None:
    cost = 0.0
    for v in setup.variants:
        score.replica_hours[v.name] += asked[v.name] * w_s / 3600.0
        cost += asked[v.name] * setup.cost_per_replica_hour(v)
        score.series[v.name].append(asked[v.name])
    score.cost += cost * w_s / 3600.0
    score.series["cost_per_hour"].append(cost)


def _check_inventory(setup: FleetSetup, score: PolicyScore, sims: Mapping[str, MixedSimulator],
                     asked: Mapping[str, int]) -> None:
    want: dict[str, int] = {}
    held: dict[str, int] = {}
    for m in setup.models:
        counts = sims[m.name].counts(_HELD)
        for v in m.variants:
            want[v.accelerator] = want.get(v.accelerator, 0) + asked[v.name] * v.gpus
            held[v.accelerator] = held.get(v.accelerator, 0) + counts[v.name] * v.gpus
    score.inventory_violations += int(any(n > setup.inventory.get(k, 0) for k, n in want.items()))
    score.gpus_held_over_inventory += int(
        any(n > setup.inventory.get(k, 0) for k, n in held.items()))


def _measure(sim: MixedSimulator, start: float, end: float, setup: FleetSetup, model: str,
             rates: np.ndarray, k: int) -> tuple[ModelWindow, float, float]:
    """The model's window as policies read it, and its mean TTFT and ITL (ms)."""
    t = sim.requests
    n = t.size
    arrival, first, finish = t.arrival_s[:n], t.first_token_s[:n], t.finish_s[:n]
    n_in, n_out = t.input_tokens[:n], t.output_tokens[:n]
    with np.errstate(invalid="ignore"):
        firsts = (first > start) & (first <= end)
        done = (finish > start) & (finish <= end) & (n_out > 1)
        in_flight = int(np.count_nonzero((arrival <= end) & ~(finish <= end) & ~t.rejected[:n]))
        tpot = (finish - first) * 1000.0 / np.maximum(n_out - 1, 1)
    ttft_all = (first - arrival) * 1000.0
    arrived = (arrival > start) & (arrival <= end)
    ttft = float(ttft_all[firsts].mean()) if firsts.any() else (
        float("inf") if arrived.any() else float("nan"))
    itl = float(tpot[done].mean()) if done.any() else float("nan")
    owner = np.array(sim.replica_variants() or [""], dtype=object)
    replica = t.replica[:n]
    variant_of = np.where(replica >= 0, owner[np.maximum(replica, 0)], "")
    ready = sim.counts((ReplicaState.READY,))
    asked = sim.counts()
    variants = {}
    model_setup = next(m for m in setup.models if m.name == model)
    for v in model_setup.variants:
        mine = variant_of == v.name
        obs = None
        f, d = firsts & mine, done & mine
        came = int(np.count_nonzero(arrived & mine))
        if ready[v.name] > 0 and min(came, f.sum(), d.sum()) >= MIN_OBSERVED:
            obs = Observation(
                rate_rps=came / (end - start) / ready[v.name],
                avg_input_tokens=float(n_in[d].mean()), avg_output_tokens=float(n_out[d].mean()),
                ttft_ms=float(ttft_all[f].mean()), itl_ms=float(tpot[d].mean()),
                max_batch_size=v.server.max_batch_size, timestamp=end,
            )  # fmt: skip
        variants[v.name] = VariantWindow(asked=asked[v.name], ready=ready[v.name],
                                         observation=obs)
    seen = arrival <= end
    workload = Workload(float(n_in[seen].mean()) if seen.any() else 1.0,
                        max(float(n_out[seen].mean()), 1.0) if seen.any() else 1.0)
    recent = float(rates[max(k - 1, 0): k + 1].max())
    # The windows a replica asked for now serves in: from the next one to a startup delay on.
    reach = math.ceil(max(v.truth.startup_delay_s for v in model_setup.variants) / setup.window_s)
    coming = rates[k + 1: k + 2 + reach]
    ahead = (float(coming.max()) if coming.size else recent) * (1.0 + setup.demand_margin)
    window = ModelWindow(demand_rps=recent * (1.0 + setup.demand_margin), workload=workload,
                         ahead_rps=ahead,
                         input_cv=_cv(n_in[seen]), output_cv=_cv(n_out[seen]),
                         in_flight=in_flight, variants=variants)
    return window, ttft, itl


def _cv(values: np.ndarray) -> float:
    mean = float(values.mean()) if values.size else 0.0
    return float(values.std()) / mean if mean > 0 else 0.0


def fleet_json(setup: FleetSetup, scores: Sequence[PolicyScore], windows: int) -> dict[str, Any]:
    return {
        "window_s": setup.window_s,
        "windows": windows,
        "judged_from_s": setup.judged_from_s,
        "inventory": dict(setup.inventory),
        "prices_per_gpu_hour": dict(setup.prices),
        "variants": {v.name: v.model for v in setup.variants},
        "targets": {m.name: {"ttft_ms": m.ttft_ms, "itl_ms": m.itl_ms} for m in setup.models},
        "policies": {s.name: s.summary() for s in scores},
        "series": {s.name: s.series for s in scores},
    }


def fleet_table(setup: FleetSetup, scores: Sequence[PolicyScore]) -> str:
    """One row per policy: cost, replica-hours by variant, windows met per model, plan
    changes, inventory violations, unserved demand."""
    names = [v.name for v in setup.variants]
    models = [m.name for m in setup.models]
    head = (["policy", "cost"] + [f"{n} h" for n in names] + [f"{m} met" for m in models]
            + ["plan changes", "inventory violations", "unserved req"])
    rows = [" | ".join(head), " | ".join("---" for _ in head)]
    for s in scores:
        cells = [s.name, f"{s.cost:.2f}"] + [f"{s.replica_hours[n]:.2f}" for n in names]
        cells += [f"{s.met[m]}/{s.judged[m]}" for m in models]
        cells += [str(s.plan_changes), str(s.inventory_violations),
                  f"{sum(s.unserved_requests.values()) + sum(s.rejected.values()):.0f}"]
        rows.append(" | ".join(cells))
    return "\n".join(f"| {r} |" for r in rows) + "\n"


def best_single_variants(setup: FleetSetup, traces: Mapping[str, RequestTrace],
                         windows: int) -> dict[str, str]:
    """Per model, the variant cheapest over the whole trace at its true capacity (hindsight);
    models choose by priority, each within the GPUs the earlier ones hold at their peak."""
    capacities = Capacities(setup)
    out = {}
    left = dict(setup.inventory)
    for m in sorted(setup.models, key=lambda m: (-m.priority, m.name)):
        tr = traces[m.name]
        workload = Workload(float(tr.input_tokens.mean()) if len(tr) else 1.0,
                            max(float(tr.output_tokens.mean()), 1.0) if len(tr) else 1.0)
        demand = window_counts(tr, setup.window_s, windows) / setup.window_s
        offers = [
            Offer(name=v.name, model=m.name, accelerator=v.accelerator, gpus=v.gpus,
                  cost_per_replica_hour=setup.cost_per_replica_hour(v),
                  kv_capacity_tokens=v.truth.kv_capacity_tokens,
                  capacity_rps=capacities.of(v, v.truth.params, workload,
                                             _cv(tr.input_tokens), _cv(tr.output_tokens)),
                  min_replicas=v.min_replicas, max_replicas=v.max_replicas)
            for v in m.variants
        ]  # fmt: skip
        planned = [float(r) * (1.0 + setup.demand_margin) for r in demand]
        out[m.name] = cheapest_single(planned, offers, left, setup.window_s)
        chosen = next(o for o in offers if o.name == out[m.name])
        left[chosen.accelerator] -= single_peak(planned, chosen, left) * chosen.gpus
    return out


def standard_policies(setup: FleetSetup, traces: Mapping[str, RequestTrace], windows: int
                      ) -> list[FleetPolicy]:
    """ours, best_single, greedy_kv, oracle and oracle_foresight, in that order."""
    single = set(best_single_variants(setup, traces, windows).values())
    return [
        PlannerPolicy("ours", setup, TunerEstimates(setup)),
        PlannerPolicy("best_single", setup, TunerEstimates(setup), allowed=single),
        GreedyKvPolicy(setup),
        PlannerPolicy("oracle", setup, TrueEstimates()),
        PlannerPolicy("oracle_foresight", setup, TrueEstimates(), foresight=True),
    ]
