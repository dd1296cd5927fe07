"""Decode-throughput analyzer of llm-d's WVA: the baseline recommender of paper §IX (Table II).

It sizes decode-token supply at a target KV-cache utilization and takes no latency target:

    ITL(u)   = a u + b                                   (11) fitted on (KV utilization, ITL)
    K_req    = n (1 - h) + m / 2                         (12) KV tokens held by one request
    C_rep    = (u_sat K_max / K_req) / ITL(u_sat)        (13, 14) decode tokens/s per replica
    D        = lambda m + Q_w / (phi ITL(u_sat))         (15) decode-token demand
    q'       = max(1, ceil(D / (eta_up C_rep)))          if D > eta_up q C_rep      (scale up)
             = max(1, q - r + ceil(D / (eta_dn C_rep)))  if D < eta_dn r C_rep      (scale down)
             = q                                         otherwise                  (16)

with q the replicas last asked for and r those ready. The line is fitted by least squares on a
window of (u, ITL) samples once it holds N_min samples in [u_lo, u_hi] spanning Delta_u
(unconstrained fit); until then only the slope is fitted to the current cycle, with the intercept
held at the last fitted one (b_0 before any fit: constrained fit). The window is cleared when
the request shape (n or m) moves by more than eps_shape, or when the line's decode rate
r (u K_max / K_req) / ITL(u) differs from the generated tokens/s by more than eps_rate for N_ver
cycles in a row at u >= u_ver (the intercept is kept). WVA reference: upstream
`internal/engines/analyzers/throughput` (wva-anchor §2.3). Units here: ms for ITL, tokens/s for
supply and demand; (15) adds requests/s to tokens/s exactly as the paper and WVA do.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from model.queueing.params import Workload
from model.queueing.validation import (
    require_at_least,
    require_int_at_least,
    require_non_negative,
    require_number,
    require_positive,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ThroughputAnalyzerConfig:
    """The analyzer's fifteen settings; defaults are paper Table II (upstream WVA defaults)."""

    baseline_itl_ms: float = 6.0  # b_0: intercept before any unconstrained fit
    min_samples: int = 10  # N_min
    max_samples: int = 20  # N_max
    min_utilization_spread: float = 0.30  # Delta_u
    max_sample_age_s: float = 1800.0  # tau_age (30 min)
    min_fit_utilization: float = 0.15  # u_lo
    max_fit_utilization: float = 0.85  # u_hi
    shape_change_tolerance: float = 0.20  # eps_shape (relative)
    rate_mismatch_tolerance: float = 0.15  # eps_rate (relative)
    mismatch_cycles: int = 3  # N_ver
    min_verification_utilization: float = 0.30  # u_ver
    saturation_utilization: float = 0.85  # u_sat
    queue_drain_factor: float = 2.0  # phi
    prefix_hit_rate: float = 0.0  # h (prefix caching disabled in the paper)
    scale_up_threshold: float = 0.85  # eta_up
    scale_down_boundary: float = 0.70  # eta_dn

    def __post_init__(self) -> None:
        for name in (
            "baseline_itl_ms",
            "max_sample_age_s",
            "saturation_utilization",
            "queue_drain_factor",
            "scale_up_threshold",
            "scale_down_boundary",
        ):
            object.__setattr__(self, name, require_positive(name, getattr(self, name)))
        for name in (
            "min_utilization_spread",
            "min_fit_utilization",
            "shape_change_tolerance",
            "rate_mismatch_tolerance",
            "min_verification_utilization",
            "prefix_hit_rate",
        ):
            object.__setattr__(self, name, require_non_negative(name, getattr(self, name)))
        object.__setattr__(
            self, "min_samples", require_int_at_least("min_samples", self.min_samples, 2)
        )
        object.__setattr__(
            self,
            "max_samples",
            require_int_at_least("max_samples", self.max_samples, self.min_samples),
        )
        object.__setattr__(
            self,
            "mismatch_cycles",
            require_int_at_least("mismatch_cycles", self.mismatch_cycles, 1),
        )
        upper = require_at_least(
            "max_fit_utilization", self.max_fit_utilization, self.min_fit_utilization
        )
        object.__setattr__(self, "max_fit_utilization", upper)
        if self.prefix_hit_rate >= 1.0:
            raise ValueError(f"`prefix_hit_rate` must be < 1, got {self.prefix_hit_rate}")


DEFAULT_THROUGHPUT_CONFIG = ThroughputAnalyzerConfig()


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetState:
    """What the analyzer reads from the deployment in one cycle (paper §IX).

    kv_utilization is the mean over ready replicas (0..1), itl_ms the throughput-weighted mean
    ITL, waiting_requests and generated_tokens_rps are summed over replicas.
    """

    kv_utilization: float
    itl_ms: float
    waiting_requests: float
    generated_tokens_rps: float
    ready_replicas: int  # r
    current_replicas: int  # q: the count last written by the actuator
    kv_capacity_tokens: float  # K_max of one replica

    def __post_init__(self) -> None:
        for name in ("kv_utilization", "itl_ms", "waiting_requests", "generated_tokens_rps"):
            object.__setattr__(self, name, require_non_negative(name, getattr(self, name)))
        object.__setattr__(
            self, "ready_replicas", require_int_at_least("ready_replicas", self.ready_replicas, 0)
        )
        object.__setattr__(
            self,
            "current_replicas",
            require_int_at_least("current_replicas", self.current_replicas, 0),
        )
        object.__setattr__(
            self,
            "kv_capacity_tokens",
            require_positive("kv_capacity_tokens", self.kv_capacity_tokens),
        )


class FitTier(StrEnum):
    """Which ITL line sized this cycle."""

    UNCONSTRAINED = "unconstrained"  # slope and intercept from the window
    CONSTRAINED = "constrained"  # slope from this cycle, intercept held
    NONE = "none"  # no line could be evaluated


class ThroughputStatus(StrEnum):
    """Outcome of one cycle; values are exported label values."""

    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"
    HOLD = "hold"
    NO_FIT = "no_fit"


THROUGHPUT_MESSAGES: dict[ThroughputStatus, str] = {
    ThroughputStatus.SCALE_UP: "decode demand exceeds the provisioned supply at eta_up",
    ThroughputStatus.SCALE_DOWN: "decode demand is below the ready supply at eta_dn",
    ThroughputStatus.HOLD: "decode demand is within the scaling band",
    ThroughputStatus.NO_FIT: "no ITL line could be evaluated; the replica count is kept",
}


@dataclass(frozen=True, slots=True)
class ItlLine:
    """ITL(u) = slope u + intercept, in ms, u the KV-cache utilization (paper eq. 11)."""

    slope_ms: float
    intercept_ms: float

    def at(self, utilization: float) -> float:
        """ITL (ms) at a KV utilization."""
        return self.slope_ms * utilization + self.intercept_ms


@dataclass(frozen=True, slots=True, kw_only=True)
class ThroughputPlan:
    """Replicas for the next cycle and the supply/demand behind them (tokens/s, ms)."""

    replicas: int
    status: ThroughputStatus
    message: str
    fit: FitTier
    total_rate_rps: float
    demand_tokens_per_s: float | None  # D; None without a line
    replica_supply_tokens_per_s: float | None  # C_rep
    itl_at_saturation_ms: float | None  # ITL(u_sat)
    line: ItlLine | None
    window_size: int


def kv_tokens_per_request(workload: Workload, prefix_hit_rate: float) -> float:
    """K_req = n (1 - h) + m / 2: mean KV tokens one running request holds (paper eq. 12)."""
    return workload.avg_input_tokens * (1.0 - prefix_hit_rate) + workload.avg_output_tokens / 2.0


def decode_throughput_replicas(
    total_rate_rps: float,
    workload: Workload,
    fleet: FleetState,
    line: ItlLine,
    config: ThroughputAnalyzerConfig | None = None,
    fit: FitTier = FitTier.UNCONSTRAINED,
    window_size: int = 0,
) -> ThroughputPlan:
    """Replicas from decode-token supply and demand for a given ITL line (paper eqs. 12-16);
    Table II defaults when no config is given."""
    total = require_non_negative("total_rate_rps", total_rate_rps)
    config = config or DEFAULT_THROUGHPUT_CONFIG
    itl_sat = line.at(config.saturation_utilization)
    k_req = kv_tokens_per_request(workload, config.prefix_hit_rate)
    q, r = fleet.current_replicas, fleet.ready_replicas
    if not (itl_sat > 0.0 and math.isfinite(itl_sat)) or k_req <= 0.0:
        return _hold(total, fleet, ThroughputStatus.NO_FIT, FitTier.NONE, line, window_size)
    itl_sat_s = itl_sat / 1000.0
    supply = config.saturation_utilization * fleet.kv_capacity_tokens / k_req / itl_sat_s
    demand = total * workload.avg_output_tokens + fleet.waiting_requests / (
        config.queue_drain_factor * itl_sat_s
    )
    if demand > config.scale_up_threshold * q * supply:
        replicas = max(1, math.ceil(demand / (config.scale_up_threshold * supply)))
    elif demand < config.scale_down_boundary * r * supply:
        replicas = max(1, q - r + math.ceil(demand / (config.scale_down_boundary * supply)))
    else:
        replicas = q
    if replicas > q:
        status = ThroughputStatus.SCALE_UP
    elif replicas < q:
        status = ThroughputStatus.SCALE_DOWN
    else:
        status = ThroughputStatus.HOLD
    return ThroughputPlan(
        replicas=replicas,
        status=status,
        message=THROUGHPUT_MESSAGES[status],
        fit=fit,
        total_rate_rps=total,
        demand_tokens_per_s=demand,
        replica_supply_tokens_per_s=supply,
        itl_at_saturation_ms=itl_sat,
        line=line,
        window_size=window_size,
    )


def _hold(
    total: float,
    fleet: FleetState,
    status: ThroughputStatus,
    fit: FitTier,
    line: ItlLine | None,
    window_size: int,
) -> ThroughputPlan:
    return ThroughputPlan(
        replicas=fleet.current_replicas,
        status=status,
        message=THROUGHPUT_MESSAGES[status],
        fit=fit,
        total_rate_rps=total,
        demand_tokens_per_s=None,
        replica_supply_tokens_per_s=None,
        itl_at_saturation_ms=None,
        line=line,
        window_size=window_size,
    )


class ThroughputAnalyzer:
    """The stateful analyzer: ITL window, held intercept, shape and decode-rate checks."""

    def __init__(self, config: ThroughputAnalyzerConfig | None = None) -> None:
        self.config = config or DEFAULT_THROUGHPUT_CONFIG
        self._window: deque[tuple[float, float, float]] = deque()  # (time s, u, ITL ms)
        self._intercept_ms = self.config.baseline_itl_ms  # b_p
        self._shape: tuple[float, float] | None = None  # (n, m) the window was built under
        self._mismatches = 0

    @property
    def window_size(self) -> int:
        """Samples currently held for the unconstrained fit."""
        return len(self._window)

    @property
    def held_intercept_ms(self) -> float:
        """b_p: the intercept the constrained fit uses (ms)."""
        return self._intercept_ms

    def recommend(
        self, total_rate_rps: float, workload: Workload, fleet: FleetState, *, timestamp_s: float
    ) -> ThroughputPlan:
        """One control cycle: update the ITL line from `fleet`, then size for the offered rate
        (req/s); the window's clock is timestamp_s (s)."""
        total = require_non_negative("total_rate_rps", total_rate_rps)
        now = require_number("timestamp_s", timestamp_s)
        cfg = self.config
        self._track_shape(workload)
        self._add_sample(now, fleet)
        line, tier = self._fit(fleet)
        size = self.window_size
        if line is None:
            return _hold(total, fleet, ThroughputStatus.NO_FIT, FitTier.NONE, None, size)
        self._verify_rate(line, workload, fleet)
        return decode_throughput_replicas(total, workload, fleet, line, cfg, tier, size)

    def _track_shape(self, workload: Workload) -> None:
        shape = (workload.avg_input_tokens, workload.avg_output_tokens)
        if self._shape is not None:
            tol = self.config.shape_change_tolerance
            moved = any(
                abs(now - ref) > tol * ref for now, ref in zip(shape, self._shape, strict=True)
            )
            if not moved:
                return
            self._window.clear()  # the (u, ITL) relation depends on the request shape
        self._shape = shape

    def _add_sample(self, now: float, fleet: FleetState) -> None:
        cfg = self.config
        while self._window and now - self._window[0][0] > cfg.max_sample_age_s:
            self._window.popleft()
        u = fleet.kv_utilization
        if cfg.min_fit_utilization <= u <= cfg.max_fit_utilization and fleet.itl_ms > 0.0:
            self._window.append((now, u, fleet.itl_ms))
            while len(self._window) > cfg.max_samples:
                self._window.popleft()

    def _fit(self, fleet: FleetState) -> tuple[ItlLine | None, FitTier]:
        cfg = self.config
        if len(self._window) >= cfg.min_samples:
            u = np.array([s[1] for s in self._window])
            itl = np.array([s[2] for s in self._window])
            if u.max() - u.min() >= cfg.min_utilization_spread:
                slope, intercept = np.polyfit(u, itl, 1)
                self._intercept_ms = float(intercept)
                return ItlLine(float(slope), float(intercept)), FitTier.UNCONSTRAINED
        u_now = fleet.kv_utilization
        if u_now > 0.0 and fleet.itl_ms > 0.0:
            # One deployment-level sample: A = sum((ITL - b) u) / sum(u^2) = (ITL - b) / u.
            slope = (fleet.itl_ms - self._intercept_ms) / u_now
            return ItlLine(slope, self._intercept_ms), FitTier.CONSTRAINED
        return None, FitTier.NONE

    def _verify_rate(self, line: ItlLine, workload: Workload, fleet: FleetState) -> None:
        cfg = self.config
        u = fleet.kv_utilization
        observed = fleet.generated_tokens_rps
        itl_u = line.at(u)
        if u < cfg.min_verification_utilization or observed <= 0.0 or itl_u <= 0.0:
            self._mismatches = 0
            return
        k_req = kv_tokens_per_request(workload, cfg.prefix_hit_rate)
        running = u * fleet.kv_capacity_tokens / k_req * fleet.ready_replicas
        predicted = running / (itl_u / 1000.0)
        if abs(predicted - observed) > cfg.rate_mismatch_tolerance * observed:
            self._mismatches += 1
        else:
            self._mismatches = 0
        if self._mismatches >= cfg.mismatch_cycles:
            self._window.clear()  # the intercept b_p is kept
            self._mismatches = 0
