"""The autoscaling policies a replay compares, behind one interface (`engine.Policy`): each
reads a window's `WindowView` and proposes a metric value against a per-replica target, which
the arm's scaler (exporter/replay/hpa.py) turns into a replica count.

- `OursPolicy`: the daemon's own two phases (observe, decide: exporter.sizing.cycle) on the
  configured deployment, starting from what the config gives (no parameters, or
  `initial_params` as a seed); its
  proposal is `vllm_sizer_desired_replicas` (AverageValue 1), the hand-over count included
  (exporter.sizing.handover), as the shipped KEDA and HPA queries read it.
- `ThroughputPolicy`: the decode-throughput analyzer (paper §IX, llm-d WVA's defaults).
- `ReactivePolicy`: KEDA on one vLLM gauge summed over the pods at the window's end (requests
  waiting, or KV-cache usage), AverageValue at a threshold per replica.
- `FixedPolicy`: N replicas, whatever the load.
"""

from __future__ import annotations

import logging
import math
from enum import StrEnum

from exporter.config.values import DeploymentConfig
from exporter.daemon.log_lines import InfeasibleTargets
from exporter.replay.engine import Proposal
from exporter.replay.perfect import WindowView
from exporter.sizing.cycle import Sizer
from exporter.sizing.forecast_choice import ForecastStrategy
from exporter.sizing.what_if import ServedEstimate, WhatIf, predict
from model.baselines.throughput_analyzer import ThroughputAnalyzer
from model.queueing.params import ServiceParams, Workload

logger = logging.getLogger(__name__)


class PolicyName(StrEnum):
    """The policies `vllm-sizer replay` knows; report and JSON keys."""

    OURS = "ours"
    THROUGHPUT = "throughput"
    REACTIVE = "reactive"
    FIXED = "fixed"


class ReactiveMetric(StrEnum):
    """The vLLM gauge a reactive KEDA trigger sums over the pods."""

    WAITING = "waiting"  # vllm:num_requests_waiting
    KV_CACHE = "kv_cache"  # vllm:kv_cache_usage_perc (0-1 per pod)


class OursPolicy:
    """Our recommender through the daemon's own two phases (exporter.sizing.cycle): each
    window the replay simulated is observed, then decided on."""

    def __init__(
        self,
        deployment: DeploymentConfig,
        window_s: float,
        *,
        name: str = PolicyName.OURS.value,
        forecaster: ForecastStrategy | None = None,
    ) -> None:
        """`deployment` as configured (its source is not read: the replay observes);
        `window_s` is the cycle period the windows come at; `forecaster` replaces the
        config's look-ahead (a variant of ours: exporter/replay/forecast_arms.py)."""
        self.name = name
        self.window_s = window_s
        self._deployment = deployment.name
        self.sizer = Sizer((deployment,))
        self.cycle = self.sizer.cycles[deployment.name]
        if forecaster is not None:
            self.cycle.forecaster = forecaster
        self._infeasible = InfeasibleTargets(logger)  # warned as the daemon warns

    def decide(self, view: WindowView, now_s: float, provisioned: int) -> Proposal:
        estimate = self.sizer.observe(
            self._deployment, view.observation, now_s, prompt_tokens=view.prompt_tokens
        )
        decision = self.sizer.decide({self._deployment: estimate})[self._deployment]
        for message in estimate.warnings:
            logger.warning("%s", message)
        if decision.sizing_rate_rps is not None:
            dep = self.cycle.config
            rate, targets = decision.sizing_rate_rps, decision.infeasible_targets
            self._infeasible.note(dep.name, targets, dep.max_replicas, rate)
        desired = provisioned if decision.desired_replicas is None else decision.desired_replicas
        return Proposal(
            value=desired,
            reason=decision.reason.value,
            tuner_state=self.cycle.tuner.state.value,
            capacity_rps=decision.max_rate_per_replica_rps,
        )

    def predict(self, rate_rps: float, replicas: int | None) -> WhatIf:
        """What-if at a total rate from the current estimate, as the daemon's /predict
        answers it (LookupError without one)."""
        cycle, last = self.cycle, self.cycle.recommender.last
        served = ServedEstimate(
            config=cycle.config, tuner=cycle.tuner.estimate(), workload=cycle.workload,
            inputs=cycle.inputs, current_replicas=None if last is None else last.current_replicas,
            slope_known=cycle.slope_known,
        )  # fmt: skip
        return predict(served, rate_rps, replicas, ())

    @property
    def params(self) -> ServiceParams | None:
        """The current estimate."""
        return self.cycle.params

    def close(self) -> None:
        """Nothing to release: the policy holds no thread or source."""


class ThroughputPolicy:
    """The decode-throughput analyzer; q is the count last asked for."""

    def __init__(
        self,
        kv_capacity_tokens: float,
        max_replicas: int,
        *,
        name: str = PolicyName.THROUGHPUT.value,
    ) -> None:
        """`kv_capacity_tokens`: one replica's, used until the pods' exposition gives it."""
        self.name = name
        self.analyzer = ThroughputAnalyzer()
        self._kv = kv_capacity_tokens
        self._max = max_replicas
        self._workload: Workload | None = None

    def decide(self, view: WindowView, now_s: float, provisioned: int) -> Proposal:
        obs = view.observation
        if obs.avg_input_tokens is not None and obs.avg_output_tokens is not None:
            self._workload = Workload(obs.avg_input_tokens, max(obs.avg_output_tokens, 1.0))
        if self._workload is None or obs.ready_pods == 0:
            return Proposal(value=provisioned, reason="no_workload")
        kv = self._kv if obs.kv_capacity_tokens is None else obs.kv_capacity_tokens
        plan = self.analyzer.recommend(
            obs.arrival_rate_rps, self._workload, view.fleet_state(provisioned, kv),
            timestamp_s=now_s,
        )  # fmt: skip
        return Proposal(
            value=min(plan.replicas, self._max), reason=f"{plan.status.value}/{plan.fit.value}"
        )


class ReactivePolicy:
    """KEDA on a vLLM gauge summed over the pods, AverageValue `threshold` per replica."""

    def __init__(
        self, metric: ReactiveMetric, threshold: float, *, name: str = PolicyName.REACTIVE.value
    ) -> None:
        if not (math.isfinite(threshold) and threshold > 0):
            raise ValueError(f"`threshold` must be a number > 0, got {threshold}")
        self.name = name
        self.metric = metric
        self.threshold = threshold

    def decide(self, view: WindowView, now_s: float, provisioned: int) -> Proposal:
        if self.metric is ReactiveMetric.WAITING:
            value = float(view.waiting_requests)
        else:
            value = view.kv_usage_ratio * view.observation.read_pods
        return Proposal(value=value, target=self.threshold, reason=self.metric.value)


class FixedPolicy:
    """Always `replicas`."""

    def __init__(self, replicas: int, *, name: str = PolicyName.FIXED.value) -> None:
        if replicas < 1:
            raise ValueError(f"`replicas` must be an integer >= 1, got {replicas}")
        self.name = name
        self.replicas = replicas

    def decide(self, view: WindowView, now_s: float, provisioned: int) -> Proposal:
        return Proposal(value=self.replicas, reason="fixed")
