"""When a deployment with scale_from_zero goes to 0 replicas, and when it comes back.

Pure decision logic (no I/O, no clock reads), applied by the recommender on top of its serving
decision, which never goes below 1. The rules:
- 0 only with the demand read at exactly 0, no request running, waiting or arriving at any
  pod (all of them read), and that for `idle_s` in a row (or already at 0);
- back from 0 in the first cycle whose demand reads above 0 (the recommender sizes it);
- a failed demand read is unknown demand: it restarts the idle count, never turns into a new
  0, and at 0 keeps 0 while no pod is busy (idle pods at 0 are KEDA's cooldown).
State (whether 0 stands, since when the deployment is idle) is saved with the stabilization
history, in wall-clock seconds, so a restart at 0 stays at 0.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Any

from exporter.collector.observations import DeploymentObservation, ObservationStatus
from exporter.config.values import ScaleFromZeroConfig

_USABLE = (ObservationStatus.OK, ObservationStatus.NO_LATENCY)


class PodsState(StrEnum):
    """What the vLLM metrics say about a deployment's pods this cycle."""

    NONE = "none"  # the read worked and found no pod
    IDLE = "idle"  # every pod read: nothing arrived in the window, nothing runs or waits
    BUSY = "busy"  # requests arrived, run or wait
    UNKNOWN = "unknown"  # pods that could not all be read, or no window yet
    UNREAD = "unread"  # the source failed


def pods_state(obs: DeploymentObservation | None) -> PodsState:
    """The state of the pods from one cycle's observation (None: the source failed)."""
    if obs is None:
        return PodsState.UNREAD
    if obs.status is ObservationStatus.NO_PODS and obs.ready_pods == 0:
        return PodsState.NONE
    if obs.status not in _USABLE:
        return PodsState.UNKNOWN
    if obs.arrival_rate_rps > 0 or (obs.requests_in_flight or 0.0) > 0:
        return PodsState.BUSY
    if obs.unobserved_pods or obs.requests_in_flight is None:
        return PodsState.UNKNOWN
    return PodsState.IDLE


class Verdict(StrEnum):
    """What the gate makes of the serving decision."""

    SERVE = "serve"  # the serving decision stands
    IDLE = "idle"  # it stands, counting down to 0
    ZERO = "zero"  # 0 replicas: no demand, nothing running
    HOLD_ZERO = "hold_zero"  # 0 stays: the demand is unknown
    FROM_ZERO = "from_zero"  # demand at 0 replicas: size from it


class ZeroGate:
    """Per-deployment scale-to-zero state: whether 0 stands and since when all is idle (s)."""

    def __init__(self, config: ScaleFromZeroConfig) -> None:
        self.config = config
        self.at_zero = False
        self.idle_since_s: float | None = None

    def judge(self, now_s: float, pods: PodsState, demand: float | None) -> Verdict:
        """The verdict at wall time now_s (s); `demand` None = the read failed. Every 0 comes
        through a full idle count, even at a first start without pods (Prometheus may not have
        scraped them yet), unless 0 stood before a restart."""
        # Nothing can run: no pod, or 0 stands and the source is down (it was empty before).
        empty = pods is PodsState.NONE or (pods is PodsState.UNREAD and self.at_zero)
        # Pods that run or cannot be judged: neither 0 nor a count towards it.
        busy = pods in (PodsState.BUSY, PodsState.UNKNOWN) or (
            pods is PodsState.UNREAD and not empty
        )
        if demand is None or demand > 0 or busy:
            self.idle_since_s = None
        if demand is None:
            # Idle pods at 0 are KEDA's cooldown, not demand: a 1 now would restart it.
            keep = empty or pods is PodsState.IDLE
            return Verdict.HOLD_ZERO if self.at_zero and keep else Verdict.SERVE
        if demand > 0 or busy:
            self.at_zero = False
            return Verdict.FROM_ZERO if empty else Verdict.SERVE
        if self.at_zero:
            return Verdict.ZERO
        if self.idle_since_s is None:
            self.idle_since_s = now_s
        if now_s - self.idle_since_s >= self.config.idle_s:
            self.at_zero = True
            return Verdict.ZERO
        return Verdict.IDLE

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe state (wall-clock seconds)."""
        return {"at_zero": self.at_zero, "idle_since_s": self.idle_since_s}

    def restore(self, data: Any, now_s: float) -> None:
        """Load `to_dict`'s output; a value of the wrong shape, or a time in the future, is
        dropped (the count restarts)."""
        if not isinstance(data, dict):
            return
        at_zero = data.get("at_zero")
        self.at_zero = at_zero if isinstance(at_zero, bool) else False
        since = data.get("idle_since_s")
        self.idle_since_s = None
        if isinstance(since, int | float) and not isinstance(since, bool):
            if math.isfinite(since) and since <= now_s:
                self.idle_since_s = float(since)

