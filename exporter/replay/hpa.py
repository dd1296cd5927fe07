"""The HPA's replica arithmetic, as KEDA's HPA applies it to one external metric of type
AverageValue (Kubernetes `pkg/controller/podautoscaler`, autoscaling/v2 `behavior`):

1. raw = ceil(value / target), unless value / (target x current) is within the tolerance of 1
   (then current);
2. stabilization: raw is recorded; the count is held between the lowest recommendation of the
   scale-up window and the highest of the scale-down window (both including this one);
3. rate limits: each policy allows, from the count at the start of its period (the count now
   minus the changes made within the period), `Pods` more (fewer) replicas or `Percent` more
   (fewer) of them; `select: Max` takes the policy allowing the largest change, `Min` the
   smallest, `Disabled` none;
4. the count is kept within [min_replicas, max_replicas].

Two behaviours are predefined: Kubernetes' defaults (tolerance 10 %, scale-down stabilization
300 s, up by 100 % or 4 pods per 15 s, down by 100 % per 15 s) and the one the shipped
ScaledObject sets for the sizer's gauge (docs/operate/keda-hpa.md: tolerance 0, no
stabilization, any step up to max_replicas at once). The HPA acts once per replay window.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from enum import StrEnum

from exporter.replay.engine import Proposal

K8S_PERIOD_S = 15.0
K8S_TOLERANCE = 0.1
K8S_SCALE_DOWN_STABILIZATION_S = 300.0
K8S_SCALE_UP_PODS = 4


class PolicyKind(StrEnum):
    """How a rate-limit policy counts its step."""

    PODS = "Pods"
    PERCENT = "Percent"


class Select(StrEnum):
    """Which policy wins when several allow different steps."""

    MAX = "Max"
    MIN = "Min"
    DISABLED = "Disabled"


@dataclass(frozen=True, slots=True)
class StepPolicy:
    """At most `value` pods (or percent) of change per `period_s` seconds."""

    kind: PolicyKind
    value: int
    period_s: float = K8S_PERIOD_S


@dataclass(frozen=True, slots=True, kw_only=True)
class Rules:
    """One direction's behaviour: stabilization window, tolerance, rate-limit policies."""

    stabilization_s: float = 0.0
    tolerance: float = K8S_TOLERANCE
    policies: tuple[StepPolicy, ...] = (StepPolicy(PolicyKind.PERCENT, 100),)
    select: Select = Select.MAX


@dataclass(frozen=True, slots=True, kw_only=True)
class Behavior:
    """The HPA's `behavior` for both directions."""

    scale_up: Rules
    scale_down: Rules

    @classmethod
    def kubernetes_default(cls) -> Behavior:
        """What an HPA without `behavior` does."""
        return cls(
            scale_up=Rules(
                policies=(
                    StepPolicy(PolicyKind.PERCENT, 100),
                    StepPolicy(PolicyKind.PODS, K8S_SCALE_UP_PODS),
                ),
            ),
            scale_down=Rules(stabilization_s=K8S_SCALE_DOWN_STABILIZATION_S),
        )

    @classmethod
    def shipped(cls, max_replicas: int) -> Behavior:
        """config/k8s/base/keda-scaledobject.yaml's: the sizer's count applied as it is."""
        return cls(
            scale_up=Rules(
                tolerance=0.0,
                policies=(
                    StepPolicy(PolicyKind.PERCENT, 100),
                    StepPolicy(PolicyKind.PODS, max(max_replicas, 1)),
                ),
            ),
            scale_down=Rules(tolerance=0.0),
        )


class Hpa:
    """One HPA on one Deployment; times in s on the replay's clock."""

    def __init__(self, behavior: Behavior, min_replicas: int, max_replicas: int) -> None:
        if not 0 <= min_replicas <= max_replicas:
            raise ValueError(
                f"replicas must satisfy 0 <= min <= max, got min {min_replicas}, "
                f"max {max_replicas}"
            )
        self.behavior = behavior
        self.min_replicas = min_replicas
        self.max_replicas = max_replicas
        self._recommendations: deque[tuple[float, int]] = deque()
        self._ups: deque[tuple[float, int]] = deque()  # (time, replicas added)
        self._downs: deque[tuple[float, int]] = deque()

    def scale(self, now_s: float, current: int, proposal: Proposal) -> int:
        """The count after this evaluation."""
        self._forget(now_s)
        raw = self._raw(current, proposal)
        stable = self._stabilized(now_s, current, raw)
        limited = self._limited(now_s, current, stable)
        out = min(max(limited, self.min_replicas), self.max_replicas)
        if out > current:
            self._ups.append((now_s, out - current))
        elif out < current:
            self._downs.append((now_s, current - out))
        return out

    def _forget(self, now_s: float) -> None:
        """Drop scale events older than every policy's period: the history stays bounded."""
        b = self.behavior
        longest = max((p.period_s for p in (*b.scale_up.policies, *b.scale_down.policies)),
                      default=0.0)
        for events in (self._ups, self._downs):
            while events and events[0][0] <= now_s - longest:
                events.popleft()

    def _raw(self, current: int, proposal: Proposal) -> int:
        if not proposal.target > 0:
            raise ValueError(f"the metric target must be > 0, got {proposal.target}")
        if current > 0:
            ratio = proposal.value / (proposal.target * current)
            low = 1.0 - self.behavior.scale_down.tolerance
            high = 1.0 + self.behavior.scale_up.tolerance
            if low <= ratio <= high:
                return current
        return max(0, math.ceil(proposal.value / proposal.target))

    def _stabilized(self, now_s: float, current: int, raw: int) -> int:
        up_s = self.behavior.scale_up.stabilization_s
        down_s = self.behavior.scale_down.stabilization_s
        keep_s = max(up_s, down_s)
        while self._recommendations and self._recommendations[0][0] <= now_s - keep_s:
            self._recommendations.popleft()
        self._recommendations.append((now_s, raw))
        up = min(r for t, r in self._recommendations if t > now_s - up_s or t == now_s)
        down = max(r for t, r in self._recommendations if t > now_s - down_s or t == now_s)
        return min(max(current, up), down)

    def _limited(self, now_s: float, current: int, desired: int) -> int:
        if desired > current:
            rules = self.behavior.scale_up
            if rules.select is Select.DISABLED:
                return current
            proposals = [self._step_limit(now_s, current, p, True) for p in rules.policies]
            limit = max(proposals) if rules.select is Select.MAX else min(proposals)
            return min(desired, limit)
        if desired < current:
            rules = self.behavior.scale_down
            if rules.select is Select.DISABLED:
                return current
            proposals = [self._step_limit(now_s, current, p, False) for p in rules.policies]
            limit = min(proposals) if rules.select is Select.MAX else max(proposals)
            return max(desired, limit)
        return desired

    def _period_start(self, now_s: float, current: int, period_s: float) -> int:
        added = sum(n for t, n in self._ups if t > now_s - period_s)
        removed = sum(n for t, n in self._downs if t > now_s - period_s)
        return current - added + removed

    def _step_limit(self, now_s: float, current: int, policy: StepPolicy, up: bool) -> int:
        """The most (up) or fewest replicas one policy allows now."""
        start = self._period_start(now_s, current, policy.period_s)
        if policy.kind is PolicyKind.PODS:
            return start + policy.value if up else start - policy.value
        if up:  # rounded up, or a small count could never grow (as Kubernetes does)
            return math.ceil(start * (1.0 + policy.value / 100.0))
        return int(start * (1.0 - policy.value / 100.0))
