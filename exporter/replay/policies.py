"""The autoscaling policies a replay compares, behind one interface (`engine.Policy`): each
reads a window's `WindowView` and proposes a metric value against a per-replica target, which
the arm's scaler (exporter/replay/hpa.py) turns into a replica count.

- `OursPolicy`: the daemon's own cycle (observe, tune, decide) on the configured deployment,
  starting from what the config gives (no parameters, or `initial_params` as a seed); its
  proposal is `vllm_sizer_desired_replicas` (AverageValue 1), the hand-over count included
  (exporter.sizing.handover), as the shipped KEDA and HPA queries read it.
- `ThroughputPolicy`: the decode-throughput analyzer (paper §IX, llm-d WVA's defaults).
- `ReactivePolicy`: KEDA on one vLLM gauge summed over the pods at the window's end (requests
  waiting, or KV-cache usage), AverageValue at a threshold per replica.
- `FixedPolicy`: N replicas, whatever the load.
"""

from __future__ import annotations

import math
from dataclasses import replace
from enum import StrEnum

from prometheus_client import CollectorRegistry

from exporter.base.clock import ManualClock
from exporter.collector.observations import DeploymentObservation, WindowTracker
from exporter.collector.sources import SourceRead
from exporter.config.values import Config, DeploymentConfig, SourceConfig
from exporter.daemon.daemon import Daemon
from exporter.daemon.deployment_state import DeploymentRuntime
from exporter.replay.engine import Proposal
from exporter.replay.perfect import WindowView
from model.baselines.throughput_analyzer import ThroughputAnalyzer
from model.queueing.params import ServiceParams, Workload


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


class _PreparedWindows(WindowTracker):
    """Hands the daemon the observation the replay made, in place of its own two reads."""

    def __init__(self, deployment: str) -> None:
        super().__init__(deployment)
        self.next: DeploymentObservation | None = None

    def observe(
        self, read: SourceRead, fell: frozenset[str] = frozenset()
    ) -> DeploymentObservation:
        assert self.next is not None, "the policy sets the window's observation first"
        return self.next


class _NoSource:
    """A source that reads nothing: the observation comes from `_PreparedWindows`."""

    def __init__(self, clock: ManualClock) -> None:
        self._clock = clock

    def read(self) -> SourceRead:
        return SourceRead(time_s=self._clock.time(), samples=())


class OursPolicy:
    """Our recommender through the daemon's own cycle (observe, tune, decide)."""

    def __init__(
        self,
        deployment: DeploymentConfig,
        window_s: float,
        *,
        name: str = PolicyName.OURS.value,
    ) -> None:
        """`deployment` as configured (its source is replaced: the replay observes)."""
        self.name = name
        dep = replace(deployment, source=SourceConfig(scrape_urls=("http://replay",)))
        self._clock = ManualClock(0.0)
        self.daemon = Daemon(
            Config(cycle_period_s=window_s, deployments=(dep,)),
            {dep.name: _NoSource(self._clock)},
            CollectorRegistry(),
            self._clock,
        )
        self.runtime: DeploymentRuntime = self.daemon.runtimes[dep.name]
        self._feed = _PreparedWindows(dep.name)
        self.runtime.tracker = self._feed

    def decide(self, view: WindowView, now_s: float, provisioned: int) -> Proposal:
        self._clock.advance(now_s - self._clock.time())
        self._feed.next = view.observation
        decision = self.daemon.run_cycle().deployments[0].decision
        desired = provisioned if decision.desired_replicas is None else decision.desired_replicas
        return Proposal(
            value=desired,
            reason=decision.reason.value,
            tuner_state=self.runtime.tuner.state.value,
            capacity_rps=decision.max_rate_per_replica_rps,
        )

    @property
    def params(self) -> ServiceParams | None:
        """The daemon's current estimate."""
        return self.runtime.params

    def close(self) -> None:
        self.daemon.close()


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
