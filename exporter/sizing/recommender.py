"""Observation + calibration -> replica decision, with bounds and scale-down stabilization.

Pure decision logic (no I/O, no clock reads): the daemon passes the time in.
The highest recommendation within the stabilization window wins, as the HPA does for scale-down,
so scale-up is immediate. History is kept in wall-clock seconds so it survives a restart.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from exporter.collector.observations import DeploymentObservation, ObservationStatus
from exporter.collector.saturation import Saturation
from exporter.config.values import DemandKind, DeploymentConfig
from exporter.sizing.evidence import PastMiss, bounded, envelope, holds_load, miss_floor
from exporter.sizing.feasibility import infeasible_at_max
from exporter.sizing.forecast import forecast
from exporter.sizing.forecast_choice import held_for_rise
from exporter.sizing.forecasters import NOISE_WINDOWS, rising_slope
from exporter.sizing.handover import Handover
from exporter.sizing.reasons import REASON_MESSAGES, Reason
from exporter.sizing.scale_to_zero import PodsState, Verdict, ZeroGate, pods_state
from exporter.sizing.slo_targets import BindingTarget, PredictedPercentile, binding_target
from exporter.sizing.stabilization import ScaleDownWindow
from exporter.sizing.traffic import ModelInputs
from model import Observation, PercentileTarget, ServiceParams, Workload
from model.calibration.trust import ModelBias

# Look-ahead: the trend is a least-squares slope over this many recent windows (at least 3).
TREND_WINDOWS = 4
# Standard errors of its windows' noise taken off the trend's slope where a past miss is
# compared with the rate to serve (`evidence_rate`).
EVIDENCE_SLOPE_SIGMAS = 2.0

# A growing backlog counts as saturation only with requests actually waiting (per pod, mean
# over the window): running requests alone rise and fall with ordinary load noise.
MIN_WAITING_FOR_SATURATION = 1.0


def waiting_queue_grows(obs: DeploymentObservation) -> bool:
    """The backlog grew over the window and requests were waiting for a batch slot."""
    waiting = obs.avg_waiting_per_pod
    return obs.queue_growing and waiting is not None and waiting >= MIN_WAITING_FOR_SATURATION


def preempted(obs: DeploymentObservation) -> bool:
    """vLLM preempted requests in the window: the KV cache ran out, the window is saturated."""
    return Saturation.PREEMPTIONS in obs.saturation


# Observation verdicts that carry no rates: what the decision says instead.
_UNUSABLE = {ObservationStatus.NO_PODS: Reason.NO_PODS,
             ObservationStatus.MODEL_NOT_FOUND: Reason.MODEL_NOT_FOUND}  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """One deployment's recommendation for one cycle; ms and req/s."""

    desired_replicas: int | None  # None: nothing to recommend yet (the gauge is omitted)
    reason: Reason
    message: str
    current_replicas: int | None
    model_replicas: int | None  # the model's count before bounds and stabilization
    arrival_rate_rps: float | None
    # The rate sized for: arrival (or its trend look_ahead_s ahead) plus its margin.
    sizing_rate_rps: float | None
    # SLO capacity and saturation of one replica as published: the model's, cut to what the
    # windows proved where they do not identify it (exporter.sizing.evidence, `Envelope.claim`).
    max_rate_per_replica_rps: float | None
    saturation_rate_per_replica_rps: float | None
    predicted_ttft_ms: float | None  # at the current load on the current replicas
    predicted_itl_ms: float | None
    binding_target: BindingTarget | None = None  # None: not sized this cycle
    predicted_percentiles: tuple[PredictedPercentile, ...] = ()  # same load and replicas
    infeasible_targets: tuple[str, ...] = ()  # missed by the model at replicas.max
    # The capacity the count was sized with (at least the published one).
    sizing_capacity_rps: float | None = None
    # How far sizing_capacity_rps lies outside the windows' per-replica rates (1 within them;
    # `Bounded.extrapolation_ratio`); None without windows.
    capacity_extrapolation_ratio: float | None = None


def saturated(decision: Decision, obs: DeploymentObservation | None) -> bool | None:
    """The model says the load saturates the current replicas, or the backlog grew; None with
    neither a prediction nor an observation."""
    predicted = decision.predicted_ttft_ms
    if predicted is None and obs is None:
        return None
    model_says = predicted is not None and math.isinf(predicted)
    return model_says or (obs is not None and (waiting_queue_grows(obs) or preempted(obs)))


# slo_headroom_ratio is capped: no load (or a tiny one) would otherwise give +Inf.
MAX_HEADROOM_RATIO = 100.0


def slo_headroom_ratio(decision: Decision) -> float | None:
    """SLO capacity of the current replicas over the arrival rate: finite, 0 when saturated,
    at most MAX_HEADROOM_RATIO; None without a capacity or a rate."""
    capacity, current = decision.max_rate_per_replica_rps, decision.current_replicas
    rate, predicted = decision.arrival_rate_rps, decision.predicted_ttft_ms
    if capacity is None or current is None or rate is None:
        return None
    if predicted is not None and math.isinf(predicted):
        return 0.0
    total = capacity * current
    if rate * MAX_HEADROOM_RATIO <= total:
        return MAX_HEADROOM_RATIO
    return total / rate


def rate_margin_rps(rate_rps: float, window_s: float, arrival_cv: float, sigmas: float) -> float:
    """`sigmas` standard errors of a rate counted over `window_s` (req/s): a renewal process's
    count over a window has variance about arrival_cv^2 x its mean. The margin shrinks as
    1 / sqrt(count) relative to the rate: 6 % at 300 requests a window, 2 % at 3000."""
    if rate_rps <= 0 or window_s <= 0:
        return 0.0
    return sigmas * arrival_cv * math.sqrt(rate_rps / window_s)


class Recommender:
    """Per-deployment decision state: the stabilization history and the last decision."""

    def __init__(self, deployment: DeploymentConfig) -> None:
        self._dep = deployment
        self.window = ScaleDownWindow(deployment.scale_down_stabilization_s)
        self._trend: Sequence[tuple[float, float]] = ()  # the look-ahead's, this cycle's
        self._recent: Sequence[tuple[float, float]] = ()  # ... and the windows before it
        self._projected: float | None = None  # a forecaster's rate, this cycle's
        self._look_ahead = deployment.look_ahead_s  # the horizon, this cycle's
        zero = deployment.scale_from_zero
        self._gate = None if zero is None else ZeroGate(zero)
        self.last: Decision | None = None
        self._shortfalls: dict[PercentileTarget, float] = {}
        self._headroom = 1.0
        self._trusted = True
        self._evidence: Sequence[Observation] = ()
        self._misses: Sequence[PastMiss] = ()

    def decide(
        self,
        now_s: float,
        observation: DeploymentObservation | None,
        params: ServiceParams | None,
        workload: Workload | None,
        bias: ModelBias | tuple[float, float] | None = None,
        inputs: ModelInputs | None = None,
        *,
        demand: float | None = None,
        shortfalls: Mapping[PercentileTarget, float] | None = None,
        handover: Handover | None = None,
        evidence: Sequence[Observation] = (),
        misses: Sequence[PastMiss] = (),
        headroom: float = 1.0,
        trusted: bool = True,
        trend: Sequence[tuple[float, float]] = (),
        projected_rps: float | None = None,
        slope_known: bool = True,
        look_ahead_s: float | None = None,
    ) -> Decision:
        """The decision at wall time now_s (s) from this cycle's inputs; `bias` is the model's
        mean relative error (TTFT, ITL) on recent windows, corrected for in every prediction;
        `inputs` the model's options and limits for the measured traffic; `demand` is the
        scale_from_zero query's value (None: not read); `shortfalls` tighten percentile targets
        the observations say the model over-promises; `evidence` (windows) bounds capacity,
        whichever parameters size it, and `misses` (older windows) the count; `handover` (the
        calibration is not trusted) replaces `params`, and neither bias nor shortfalls apply to
        its parameters; the rate is sized for x `headroom` (exporter.sizing.headroom); `trend`
        is (time s, arrival rate req/s) of the recent windows whose rate was read, oldest
        first, ending with this one's (look_ahead_s extends its last TREND_WINDOWS; a
        forecaster's `projected_rps` replaces it; `look_ahead_s`, the startup delay measured,
        replaces the configured one); what is published claims no more than the
        windows identified unless how latency grows with load is `slope_known`
        (`Envelope.claim`, `DeploymentCycle.slope_known`)."""
        self._trend, self._projected = trend[-TREND_WINDOWS:], projected_rps
        self._recent = trend[-NOISE_WINDOWS:]
        self._look_ahead = self._dep.look_ahead_s if look_ahead_s is None else look_ahead_s
        self._shortfalls = {} if handover is not None else dict(shortfalls or {})
        self._evidence, self._headroom, self._trusted = evidence, headroom, trusted
        self._misses, self._slope_known = misses, slope_known
        if handover is not None:
            params, bias = handover.params, None
        decision = self._decide(
            now_s, observation, params, workload, bias, inputs, handover=handover is not None
        )
        if self._gate is not None:
            pods = pods_state(observation)
            verdict = self._gate.judge(now_s, pods, demand)
            decision = self._gated(now_s, verdict, decision, pods, demand, params, workload, bias)
        self.last = decision
        return decision

    def _gated(
        self,
        now_s: float,
        verdict: Verdict,
        serving: Decision,
        pods: PodsState,
        demand: float | None,
        params: ServiceParams | None,
        workload: Workload | None,
        bias: ModelBias | tuple[float, float] | None,
    ) -> Decision:
        """The serving decision as scale to zero has it (exporter.sizing.scale_to_zero)."""
        if verdict is Verdict.SERVE:
            return serving
        if verdict is Verdict.IDLE:
            return replace(serving, reason=Reason.IDLE, message=REASON_MESSAGES[Reason.IDLE])
        if verdict is not Verdict.FROM_ZERO:
            reason = Reason.SCALED_TO_ZERO if verdict is Verdict.ZERO else Reason.DEMAND_UNKNOWN
            current = 0 if pods is PodsState.NONE else serving.current_replicas
            return replace(
                serving,
                desired_replicas=0,
                reason=reason,
                message=REASON_MESSAGES[reason],
                current_replicas=current,
            )
        assert demand is not None and self._dep.scale_from_zero is not None  # FROM_ZERO has it
        rate = demand if self._dep.scale_from_zero.demand is DemandKind.RATE else None
        if rate is None or params is None or workload is None:
            # A queue length, or no calibration yet: one replica, then sizing from its metrics.
            return self._stabilized(now_s, 1, None, Reason.DEMAND_FROM_ZERO, 0, rate)
        outlook = forecast(
            self._dep, params, workload, bias, size_for_rps=rate, per_replica_rps=rate
        )
        plan = outlook.plan
        return self._stabilized(
            now_s,
            self._dep.max_replicas if plan.replicas is None else plan.replicas,
            plan.replicas,
            Reason.DEMAND_FROM_ZERO,
            0,
            rate,
            sizing_rate_rps=rate,
            max_rate_per_replica_rps=plan.capacity.rate_rps,
            saturation_rate_per_replica_rps=outlook.saturation_rate_per_replica_rps,
            binding_target=binding_target(plan.capacity),
            sizing_capacity_rps=plan.capacity.rate_rps,
        )

    def _decide(
        self,
        now_s: float,
        obs: DeploymentObservation | None,
        params: ServiceParams | None,
        workload: Workload | None,
        bias: ModelBias | tuple[float, float] | None,
        inputs: ModelInputs | None,
        *,
        handover: bool = False,
    ) -> Decision:
        dep = self._dep
        if obs is None or obs.status in _UNUSABLE:
            held = self.last.desired_replicas if self.last else None
            # Pods there, none of which answered: the source is down, not the deployment.
            down = obs is None or obs.status is ObservationStatus.NO_PODS and obs.ready_pods > 0
            reason = Reason.SOURCE_DOWN if down or obs is None else _UNUSABLE[obs.status]
            return _decision(held, reason, current=obs.ready_pods if obs and down else None)
        current = obs.ready_pods
        if obs.status is ObservationStatus.WARMING_UP:
            # No window to size on (first read, after a blip, after a restart): keep what was
            # recommended, so a pod still starting is not removed.
            # (A 0 that stands is no count for pods that are there: keep them.)
            return _decision(self._held(now_s) or current, Reason.FIRST_WINDOW, current=current)
        rate = obs.arrival_rate_rps
        if params is None or workload is None:
            # Without a model, the wait queue is the only capacity signal there is.
            if waiting_queue_grows(obs):
                wanted, reason = min(current + 1, dep.max_replicas), Reason.QUEUE_GROWING
            else:
                wanted = current
                reason = Reason.TUNER_WARMING if params is None else Reason.NO_WORKLOAD
            return self._stabilized(now_s, wanted, None, reason, current, rate)
        inputs = inputs or ModelInputs(dep.model, dep.server)
        sizing_rate = self._headroom * (self.projected_rate(rate) + rate_margin_rps(
            rate, obs.window_s, inputs.options.arrival_cv, dep.rate_margin_sigmas
        ))  # fmt: skip
        outlook = forecast(
            dep, params, workload, bias, size_for_rps=sizing_rate,
            per_replica_rps=rate / max(current, 1), inputs=inputs, shortfalls=self._shortfalls,
        )  # fmt: skip
        plan = outlook.plan
        evidence_rate = self.evidence_rate(rate, sizing_rate, obs.window_s, inputs)
        # An untrusted estimate scales down no further than the served rates support ...
        untrusted = handover or not self._trusted
        checked = bounded(outlook, sizing_rate, envelope(self._evidence, dep.slo),
                          current if untrusted else None, self._headroom,
                          slope_known=self._slope_known,
                          evidence_rate_rps=evidence_rate)  # fmt: skip
        max_batch = inputs.server.max_batch_size
        if (
            untrusted
            and self._headroom <= 1.0
            and holds_load(obs, checked.replicas, dep.slo, max_batch, inputs.options.arrival_cv)
        ):
            # ... nor steps up past a fleet serving its load with margin (evidence.holds_load),
            # but for the rise a forecaster expects (forecast_choice.held_for_rise).
            held = held_for_rise(current, rate, self._projected or rate)
            checked = replace(checked, replicas=min(checked.replicas or held, held), bound=True)
        extra = {
            "sizing_rate_rps": sizing_rate,
            # Published: the claim (the what-if's too); the count is sized on the envelope's
            # capacity, stepping within scale_down_floor (exporter.sizing.evidence).
            "max_rate_per_replica_rps": checked.claimed_rps,
            "saturation_rate_per_replica_rps": checked.claimed_saturation_rps,
            "sizing_capacity_rps": checked.capacity_rps,
            "capacity_extrapolation_ratio": checked.extrapolation_ratio,
            "predicted_ttft_ms": outlook.ttft_ms,
            "predicted_itl_ms": outlook.itl_ms,
            "binding_target": binding_target(plan.capacity),
            "predicted_percentiles": outlook.percentiles,
            "infeasible_targets": infeasible_at_max(  # the model's claim, without headroom
                dep, params, workload, bias, total_rps=sizing_rate / self._headroom,
                needed=plan.replicas, inputs=inputs, shortfalls=self._shortfalls),
        }  # fmt: skip
        if checked.replicas is None and handover:
            # The targets are out of the prior's reach, not necessarily of the fleet's: hold
            # (one more while the queue grows) rather than ask for replicas.max on a guess.
            wanted = current + 1 if waiting_queue_grows(obs) else current
            return self._stabilized(now_s, wanted, None, Reason.HANDOVER, current, rate, **extra)
        if checked.replicas is None:
            return self._stabilized(
                now_s, dep.max_replicas, None, Reason.SLO_INFEASIBLE, current, rate, **extra
            )
        wanted = checked.replicas
        override: Reason | None = Reason.EVIDENCE_BOUND if checked.bound else None
        if (floor := miss_floor(evidence_rate / self._headroom, self._misses)) > wanted:
            # A count that missed at this load or less, out of the tuner's window now.
            wanted, override = floor, Reason.EVIDENCE_BOUND
        if self._shortfalls and wanted >= current:
            override = Reason.TAIL_SHORTFALL
        if waiting_queue_grows(obs) and wanted <= current:
            # The estimate lags a growing backlog; the queue itself says capacity is short.
            wanted, override = current + 1, Reason.QUEUE_GROWING
        if wanted > dep.max_replicas:
            wanted, override = dep.max_replicas, Reason.MAX_REPLICAS
        held = self._held(now_s)
        if obs.unobserved_pods and held is not None and wanted < held:
            wanted, override = held, Reason.PODS_UNOBSERVED
        if handover:
            override = Reason.HANDOVER
        return self._stabilized(now_s, wanted, plan.replicas, override, current, rate, **extra)

    def _held(self, now_s: float) -> int | None:
        """What stands recommended: the last decision's count, else (after a restart) the
        highest count of the restored stabilization window; None before any."""
        if self.last is not None and self.last.desired_replicas is not None:
            return self.last.desired_replicas
        return self.window.highest(now_s)

    def evidence_rate(
        self, rate: float, sizing_rate: float, window_s: float, inputs: ModelInputs
    ) -> float:
        """The rate a past miss is compared with (`miss_floor`, and the count at a missed rate
        in `bounded`): the sizing rate, but with the look-ahead's slope less
        EVIDENCE_SLOPE_SIGMAS standard errors of its windows' noise (forecasters.rising_slope).
        A miss says a count is short at the rate it was seen at; a slope fitted to four noisy
        windows is no such rate. Compared with the whole look-ahead, one bursty window that
        missed at 4 replicas (14.9 req/s) held a bursty trace (9 req/s mean, window rates 1-17,
        projected to 20-26) at 5-6 replicas for the 20 minutes left, where a fixed 4 met 98 %
        of its windows."""
        dep = self._dep
        slope = rising_slope(self._recent, EVIDENCE_SLOPE_SIGMAS)
        ahead = rate + slope * max(self._look_ahead, 0.0)
        margin = rate_margin_rps(rate, window_s, inputs.options.arrival_cv,
                                 dep.rate_margin_sigmas)  # fmt: skip
        return min(sizing_rate, self._headroom * (ahead + margin))

    def projected_rate(self, rate: float) -> float:
        """The rate to size for (req/s): the current one, or with look_ahead_s > 0 the recent
        trend extended that far ahead when it rises, so capacity is ordered before it is needed."""
        if self._projected is not None:  # never below the window's rate
            return max(rate, self._projected)
        horizon = self._look_ahead
        if horizon <= 0 or len(self._trend) < 3:
            return rate
        t = np.array([p[0] for p in self._trend])
        r = np.array([p[1] for p in self._trend])
        slope = float(np.polyfit(t - t[-1], r, 1)[0])
        return rate + max(slope, 0.0) * horizon

    def _stabilized(
        self,
        now_s: float,
        wanted: int,
        model_replicas: int | None,
        reason: Reason | None,
        current: int,
        rate: float | None,
        **extra: Any,
    ) -> Decision:
        dep = self._dep
        wanted = min(max(wanted, dep.serving_min_replicas), dep.max_replicas)
        desired = self.window.hold(now_s, wanted)
        if reason is None or (desired > wanted and reason is Reason.QUEUE_GROWING):
            # Held above today's need by the window, whether or not the pods have caught up.
            if desired > wanted:
                reason = Reason.STABILIZING
            elif desired > current:
                reason = Reason.SCALE_UP
            elif desired < current:
                reason = Reason.SCALE_DOWN
            else:
                reason = Reason.AT_TARGET
        return _decision(
            desired,
            reason,
            current=current,
            model_replicas=model_replicas,
            arrival_rate_rps=rate,
            **extra,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe stabilization history (and scale-to-zero state)."""
        saved: dict[str, Any] = {"history": [[t, r] for t, r in self.window.entries()]}
        if self._gate is not None:
            saved["zero"] = self._gate.to_dict()
        return saved

    def restore(self, data: dict[str, Any], now_s: float) -> None:
        """Load a history saved by `to_dict`: entries that do not parse, lie in the future or
        have left the stabilization window are dropped; counts are clamped to today's bounds."""
        dep = self._dep
        kept: list[tuple[float, int]] = []
        if self._gate is not None and isinstance(data, dict):
            self._gate.restore(data.get("zero"), now_s)
        history = data.get("history", []) if isinstance(data, dict) else []
        for entry in history if isinstance(history, list) else []:
            if (
                isinstance(entry, list)
                and len(entry) == 2
                and isinstance(entry[0], int | float)
                and math.isfinite(entry[0])
                and isinstance(entry[1], int)
                and not isinstance(entry[1], bool)
            ):
                kept.append((float(entry[0]), entry[1]))
        self.window.restore(kept, now_s, dep.serving_min_replicas, dep.max_replicas)


_OPTIONAL_FIELDS = (
    "model_replicas", "arrival_rate_rps", "sizing_rate_rps", "max_rate_per_replica_rps",
    "saturation_rate_per_replica_rps", "predicted_ttft_ms", "predicted_itl_ms",
    "sizing_capacity_rps", "capacity_extrapolation_ratio",
)  # fmt: skip


def _decision(
    desired: int | None, reason: Reason, *, current: int | None, **fields: Any
) -> Decision:
    values: dict[str, Any] = {**dict.fromkeys(_OPTIONAL_FIELDS), **fields}
    return Decision(
        desired_replicas=desired,
        reason=reason,
        message=REASON_MESSAGES[reason],
        current_replicas=current,
        **values,
    )
