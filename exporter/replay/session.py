"""One `vllm-sizer replay` run: the arms of the chosen policies on one engine, scored window by
window, stoppable between two windows (the result then says it is partial)."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from exporter.replay.blas import blas_threads
from exporter.replay.engine import ApplyAsIs, Arm, ArrivalSource, Engine, FleetSettings, Step
from exporter.replay.exposition import ExpositionObserver
from exporter.replay.hpa import Hpa
from exporter.replay.policies import (
    FixedPolicy,
    OursPolicy,
    PolicyName,
    ReactivePolicy,
    ThroughputPolicy,
)
from exporter.replay.scoring import Scorecard
from exporter.replay.settings import ReplaySettings
from model.queueing.params import ServiceParams


@dataclass(slots=True)
class ReplayResult:
    """Scores per policy and the load, window by window; `partial` when stopped early."""

    settings: ReplaySettings
    truth: ServiceParams
    policies: tuple[str, ...]
    cards: dict[str, Scorecard]
    partial: bool = False
    windows: int = 0
    windows_stepped: int = 0  # simulated one by one (the rest skipped as idle stretches)
    arrivals: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    offered_rps: list[float] = field(default_factory=list)
    rejected: dict[str, int] = field(default_factory=dict)
    final_params: dict[str, dict[str, float] | None] = field(default_factory=dict)
    wall_s: float = 0.0
    # What the arrival source read, when it was read in another process (parallel.py).
    rows_read: int | None = None
    bad_rows: int = 0

    @property
    def duration_s(self) -> float:
        return self.windows * self.settings.window_s


def judged_from_s(settings: ReplaySettings) -> float:
    """The start of the first judged window: the first decision's replicas are serving."""
    return settings.window_s + settings.startup_delay_s


def longest_timer_s(node: Any) -> float:
    """The longest finite duration (a float field named `*_s`) anywhere in `node`'s
    dataclasses: every stabilization window, idle delay, look-ahead and trailing window of the
    deployment and its HPA behaviours, including keys added later."""
    longest = 0.0
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        for f in dataclasses.fields(node):
            value = getattr(node, f.name)
            if f.name.endswith("_s") and isinstance(value, float | int) and math.isfinite(value):
                longest = max(longest, float(value))
            else:
                longest = max(longest, longest_timer_s(value))
    elif isinstance(node, tuple | list):
        longest = max((longest_timer_s(x) for x in node), default=0.0)
    return longest


def rest_windows(settings: ReplaySettings) -> int:
    """Windows every arm must stay at rest before an idle stretch is skipped: past the longest
    timer of the settings (a policy's output no longer changes without load) plus one. The
    tuner counts cycles, not seconds (a recovery from a detected change settles after
    `min_observations` cycles, idle ones included; its window holds `window` points): those
    counts are timers too."""
    tuner = settings.deployment.tuner
    timed = math.ceil(longest_timer_s(settings) / settings.window_s - 1e-9)
    return max(timed, tuner.min_observations, tuner.window) + 1


def fleet_settings(
    settings: ReplaySettings, truth: ServiceParams, *, reference: bool = False
) -> FleetSettings:
    return FleetSettings(
        compiled_step=not reference,
        params=truth,
        server=settings.deployment.server,
        kv_capacity_tokens=settings.kv_capacity_tokens,
        startup_delay_s=settings.startup_delay_s,
        window_s=settings.window_s,
    )


def build_arm(settings: ReplaySettings, name: PolicyName, *, reference: bool = False) -> Arm:
    """One policy's arm: observed through the exposition, scaled by its HPA (fixed: as is);
    `reference`: every pod read through the exposition text."""
    dep = settings.deployment
    observer = ExpositionObserver(
        model_name=dep.model_name, kv_capacity_tokens=settings.kv_capacity_tokens,
        deployment=dep.name, values=not reference,
    )  # fmt: skip
    sizer_hpa = Hpa(settings.sizer_behavior, dep.min_replicas, dep.max_replicas)
    match name:
        case PolicyName.OURS:
            policy = OursPolicy(dep, settings.window_s)
            return Arm(policy, observer, sizer_hpa, settings.initial_replicas)
        case PolicyName.THROUGHPUT:
            return Arm(ThroughputPolicy(settings.kv_capacity_tokens, dep.max_replicas), observer,
                       sizer_hpa, settings.initial_replicas)
        case PolicyName.REACTIVE:
            hpa = Hpa(settings.reactive_behavior, dep.min_replicas, dep.max_replicas)
            return Arm(ReactivePolicy(settings.reactive_metric, settings.reactive_threshold),
                       observer, hpa, settings.initial_replicas)
        case PolicyName.FIXED:
            # From the same initial count as every other policy: its warm-up costs it too.
            return Arm(FixedPolicy(settings.fixed_replicas), observer, ApplyAsIs(),
                       settings.initial_replicas)


def replay(
    settings: ReplaySettings,
    truth: ServiceParams,
    policies: Sequence[PolicyName],
    arrivals: ArrivalSource,
    *,
    on_step: Callable[[Step, ReplayResult], None] | None = None,
    stop: Callable[[], bool] = lambda: False,
    skip_idle: bool = True,
    reference: bool = False,
    rest_vote: Callable[[bool], bool] | None = None,
) -> ReplayResult:
    """Replay `arrivals` under each policy until they run out or `stop()` says so (checked
    after each window); `skip_idle` skips idle stretches whole (the same report, in O(1)).
    `reference`: the engine as it was before issue 45 (the simulator's numpy replica step,
    every pod read through the exposition text), for the benches and tests that compare;
    `rest_vote`: see `Engine` (exporter/replay/parallel.py runs policies in processes)."""
    began = time.perf_counter()
    arms = [build_arm(settings, name, reference=reference) for name in policies]
    engine = Engine(fleet_settings(settings, truth, reference=reference), arms,
                    rest_windows=rest_windows(settings) if skip_idle else None,
                    rest_vote=rest_vote)
    names = tuple(name.value for name in policies)
    result = ReplayResult(
        settings, truth, names,
        {n: Scorecard.new(settings.deployment.slo, settings.window_s, judged_from_s(settings))
         for n in names},
    )  # fmt: skip
    # One BLAS thread: the policies run one process per core already (blas.py).
    with blas_threads(1):
        try:
            for step in engine.steps(arrivals):
                for window in step.arms:
                    result.cards[window.arm].add(window, step.windows)
                result.windows += step.windows
                result.windows_stepped = engine.windows_stepped
                result.arrivals += step.arrivals
                result.input_tokens += step.input_tokens
                result.output_tokens += step.output_tokens
                result.offered_rps.append(step.offered_rps)
                if on_step is not None:
                    on_step(step, result)
                if stop() and not arrivals.exhausted:
                    result.partial = True
                    break
        finally:
            for arm in arms:
                if isinstance(arm.policy, OursPolicy):
                    params = arm.policy.params
                    result.final_params[arm.policy.name] = (None if params is None
                                                            else params.to_dict())
                    arm.policy.close()
    for name, sim in engine.fleets():
        result.rejected[name] = int(sim.requests.rejected[: sim.requests.size].sum())
    result.wall_s = time.perf_counter() - began
    return result


def result_json(result: ReplayResult, price: float | None) -> dict[str, Any]:
    """The report as JSON-safe data (seconds and ms as named)."""
    s = result.settings
    return {
        "partial": result.partial,
        "windows": result.windows,
        "window_s": s.window_s,
        "duration_s": result.duration_s,
        "arrivals": result.arrivals,
        "mean_input_tokens": result.input_tokens / result.arrivals if result.arrivals else None,
        "mean_output_tokens": result.output_tokens / result.arrivals if result.arrivals
        else None,
        "wall_s": result.wall_s,
        "truth_ms": result.truth.to_dict(),
        "deployment": s.deployment.name,
        "startup_delay_s": s.startup_delay_s,
        "judged_from_s": judged_from_s(s),
        "judged_windows": max(0, result.windows - math.ceil(
            (judged_from_s(s) - 1e-9) / s.window_s)),
        "replicas": {"min": s.deployment.min_replicas, "max": s.deployment.max_replicas,
                     "initial": s.initial_replicas, "fixed": s.fixed_replicas},
        "price_per_replica_hour": price,
        "policies": {
            name: result.cards[name].summary(price)
            | {"rejected_requests": result.rejected.get(name, 0)}
            | ({"final_params_ms": result.final_params[name]}
               if name in result.final_params else {})
            for name in result.policies
        },
        "series": {
            "offered_rps": result.offered_rps,
            **{name: result.cards[name].series for name in result.policies},
        },
    }
