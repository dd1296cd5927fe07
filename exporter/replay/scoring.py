"""How each policy did, judged on the simulator's truth (not on what its collector read).

Per window: the mean TTFT of the first tokens emitted in it and the token-weighted mean
inter-token gap (vLLM's inter_token_latency _sum/_count, what `slo.itl_ms` is defined on); for
each percentile target, its percentile over the trailing `slo.window_s` (TTFT of first tokens,
per-token gaps, or per-request mean gaps of the requests finished in it), as the daemon's observed
attainment is. Percentiles come from log-spaced bins 1 % wide and are read at a bin's upper
edge: never below the exact value, at most 1 % above. A window without the values a target
needs (no first token, no gap) is not judged on it. Cost is the replicas asked for, per window:
replica-hours = sum(replicas x window) / 3600, exact for a fixed count.

Judged windows are the same for every policy: those starting at or after `judged_from_s` (the
end of the first window plus the startup delay, when the first replica any policy asked for
can serve; every policy starts from the same count). Earlier windows still cost and still feed
the trailing percentiles. Besides the shares met, a card counts the windows by the reason of
their recommendation, the reversals of the count asked for (an increase after a decrease or
the other way), and the replica-hours on replicas asked for but not ready at the window's end.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from exporter.collector.pod_observation import MS_PER_S
from exporter.config.values import SloConfig
from exporter.replay.engine import ArmWindow
from exporter.replay.perfect import token_gap_ms, window_gaps
from exporter.sizing.slo_targets import percentile_label
from model import LatencyMetric
from model.simulation.records import WindowRecords
from model.simulation.replica import IterationRecord
from model.simulation.request_table import RequestTable

FloatArray = NDArray[np.float64]
_LOW_MS = 1e-3
_RATIO = 1.01
_BINS = math.ceil(math.log(1e10) / math.log(_RATIO))  # 1 us to 10^7 ms
HANDOVER = "handover"  # OursPolicy's reason while the reactive count is proposed


@dataclass(frozen=True, slots=True)
class Target:
    """One judged target: a mean (quantile None) or a percentile of a latency, in ms."""

    metric: LatencyMetric
    quantile: float | None
    target_ms: float

    @property
    def key(self) -> str:
        """'ttft_mean', 'itl_per_token_p99', ...: report and JSON keys."""
        if self.quantile is None:
            return "ttft_mean" if self.metric is LatencyMetric.TTFT else "itl_mean"
        return f"{self.metric.value}_p{percentile_label(self.quantile)}"


def targets_of(slo: SloConfig) -> tuple[Target, ...]:
    """The configured targets: mean TTFT, mean ITL, then the percentiles."""
    out = []
    if slo.ttft_ms is not None:
        out.append(Target(LatencyMetric.TTFT, None, slo.ttft_ms))
    if slo.itl_ms is not None:
        out.append(Target(LatencyMetric.ITL_PER_TOKEN, None, slo.itl_ms))
    out += [Target(p.metric, p.quantile, p.target_ms) for p in slo.percentiles]
    return tuple(out)


def _bin_of(values_ms: FloatArray) -> NDArray[np.int64]:
    scaled = np.log(np.maximum(values_ms, _LOW_MS) / _LOW_MS) / math.log(_RATIO)
    index = scaled.astype(np.int64)
    # Rounding must never leave a value above its bin's upper edge.
    index += _LOW_MS * _RATIO ** (index + 1) < values_ms
    return np.minimum(index, _BINS - 1)


def upper_edge_ms(index: int) -> float:
    """The largest value of a bin."""
    return _LOW_MS * _RATIO ** (index + 1)


class Trailing:
    """A weighted latency histogram over the last `windows` windows."""

    def __init__(self, windows: int) -> None:
        self._parts: deque[FloatArray] = deque()
        self._windows = windows
        self._total = np.zeros(_BINS)

    def add(self, values_ms: FloatArray, weights: FloatArray) -> None:
        counts = np.bincount(_bin_of(values_ms), weights=weights, minlength=_BINS)
        part = counts.astype(np.float64)
        self._parts.append(part)
        self._total += part
        if len(self._parts) > self._windows:
            self._total -= self._parts.popleft()

    def quantile_ms(self, q: float) -> float | None:
        """The q-quantile's bin upper edge (None when empty)."""
        cum = np.cumsum(self._total)
        if cum[-1] <= 0:
            return None
        return upper_edge_ms(int(np.searchsorted(cum, q * cum[-1], side="left")))


@dataclass(frozen=True, slots=True)
class WindowTruth:
    """The latencies of one window (ms): first-token TTFTs, per-token gaps with their token
    counts, and the per-request mean gaps of requests finished in it (m > 1)."""

    ttft_ms: FloatArray
    gap_ms: FloatArray
    gap_weight: FloatArray
    request_itl_ms: FloatArray

    @classmethod
    def of(cls, records: Sequence[IterationRecord], requests: RequestTable) -> WindowTruth:
        cols = WindowRecords.of(records)
        firsts, done = cols.first_token_ids, cols.finished_ids
        n_out = requests.output_tokens[done]
        multi = done[n_out > 1]
        decode_s = requests.finish_s[multi] - requests.first_token_s[multi]
        gap_ms, gap_weight = window_gaps(records)
        return cls(
            ttft_ms=(requests.first_token_s[firsts] - requests.arrival_s[firsts]) * MS_PER_S,
            gap_ms=gap_ms,
            gap_weight=gap_weight,
            request_itl_ms=decode_s * MS_PER_S / (requests.output_tokens[multi] - 1),
        )

    def mean_ms(self, target: Target) -> float | None:
        if target.metric is LatencyMetric.TTFT:
            return float(self.ttft_ms.mean()) if self.ttft_ms.size else None
        return token_gap_ms(self.gap_ms, self.gap_weight)


@dataclass(slots=True)
class TargetScore:
    """Windows judged on one target, those within it, and the worst one."""

    judged: int = 0
    met: int = 0
    worst_ms: float | None = None
    worst_end_s: float | None = None

    def add(
        self, value_ms: float | None, target_ms: float, end_s: float, windows: int = 1
    ) -> bool | None:
        if value_ms is None:
            return None
        self.judged += windows
        self.met += windows * (value_ms <= target_ms)
        if self.worst_ms is None or value_ms > self.worst_ms:
            self.worst_ms, self.worst_end_s = value_ms, end_s
        return value_ms <= target_ms


@dataclass(slots=True)
class Scorecard:
    """One policy's running score, window by window, and its per-window series."""

    targets: tuple[Target, ...]
    window_s: float
    trailing_windows: int
    scores: dict[str, TargetScore] = field(default_factory=dict)
    all_judged: int = 0  # windows judged on at least one target
    all_met: int = 0  # ... that met every target they were judged on
    judged_from_s: float = 0.0
    replica_windows: int = 0
    unready_replica_windows: int = 0
    windows: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    reversals: int = 0
    _last_move: int = 0  # sign of the last change of the count asked for
    peak_queue: int = 0
    peak_replicas: int = 0
    series: dict[str, list[Any]] = field(default_factory=dict)
    _trailing: dict[LatencyMetric, Trailing] = field(default_factory=dict)

    @classmethod
    def new(cls, slo: SloConfig, window_s: float, judged_from_s: float = 0.0) -> Scorecard:
        targets = targets_of(slo)
        card = cls(targets, window_s, max(1, math.ceil(slo.window_s / window_s - 1e-9)),
                   judged_from_s=judged_from_s)
        card.scores = {t.key: TargetScore() for t in targets}
        card._trailing = {
            t.metric: Trailing(card.trailing_windows) for t in targets if t.quantile is not None
        }
        return card

    def add(self, window: ArmWindow, windows: int = 1) -> None:
        """Score one window, or an idle stretch of `windows` (the engine's, no records): its
        windows cost as the rest window and are judged on no target once the trailing
        percentile windows hold nothing (the engine's rest outlasts them)."""
        truth = WindowTruth.of(window.records, window.sim.requests)
        if windows > 1 and window.records:
            raise ValueError(f"a stretch of {windows} windows must hold no iteration")
        for metric, trailing in self._trailing.items():
            for _ in range(min(windows, self.trailing_windows) - 1):
                trailing.add(truth.ttft_ms[:0], truth.ttft_ms[:0])
            if metric is LatencyMetric.TTFT:
                trailing.add(truth.ttft_ms, np.ones_like(truth.ttft_ms))
            elif metric is LatencyMetric.ITL_PER_TOKEN:
                trailing.add(truth.gap_ms, truth.gap_weight)
            else:
                trailing.add(truth.request_itl_ms, np.ones_like(truth.request_itl_ms))
        row: dict[str, Any] = {
            "end_s": window.end_s,
            "provisioned": window.provisioned,
            "ready": window.view.observation.ready_pods,
            "desired": window.desired,
            "reason": window.proposal.reason,
            "peak_waiting": window.view.peak_waiting,
        }
        judging = window.start_s >= self.judged_from_s - 1e-9
        verdicts = []
        for target in self.targets:
            if target.quantile is None:
                value = truth.mean_ms(target)
            else:
                value = self._trailing[target.metric].quantile_ms(target.quantile)
            if judging:
                verdicts.append(self.scores[target.key].add(value, target.target_ms,
                                                            window.end_s, windows))
            row[target.key] = value
        row["judged"] = judging
        if windows > 1 and any(row[t.key] is not None for t in self.targets):
            raise ValueError(f"a stretch of {windows} windows must be judged on no target: the "
                             "engine's rest must outlast the trailing percentile window")
        judged = [v for v in verdicts if v is not None]
        if judged:
            self.all_judged += windows
            self.all_met += windows * all(judged)
        self.windows += windows
        self.replica_windows += windows * window.provisioned
        self.unready_replica_windows += windows * max(0, window.provisioned - row["ready"])
        reason = window.proposal.reason or "-"
        self.reasons[reason] = self.reasons.get(reason, 0) + windows
        move = (window.desired > window.provisioned) - (window.desired < window.provisioned)
        if move:
            self.reversals += move == -self._last_move
            self._last_move = move
        self.peak_queue = max(self.peak_queue, window.view.peak_waiting)
        self.peak_replicas = max(self.peak_replicas, window.provisioned)
        for key, value in row.items():
            self.series.setdefault(key, []).append(value)

    @property
    def replica_hours(self) -> float:
        return self.replica_windows * self.window_s / 3600.0

    def summary(self, price_per_replica_hour: float | None = None) -> dict[str, Any]:
        """JSON-safe figures of the policy so far."""
        out: dict[str, Any] = {
            "windows": self.windows,
            "replica_hours": self.replica_hours,
            "cost": None if price_per_replica_hour is None
            else self.replica_hours * price_per_replica_hour,
            "mean_replicas": self.replica_windows / self.windows if self.windows else None,
            "peak_replicas": self.peak_replicas,
            "peak_queue": self.peak_queue,
            "unready_replica_hours": self.unready_replica_windows * self.window_s / 3600.0,
            "reversals": self.reversals,
            "reason_share": {k: n / self.windows for k, n in sorted(self.reasons.items())},
            "handover_share": self.reasons.get(HANDOVER, 0) / self.windows if self.windows
            else None,
            "all_targets": _share(self.all_judged, self.all_met),
            "met_share": _share(self.all_judged, self.all_met)["met_share"],
            "targets": {},
        }
        for target in self.targets:
            score = self.scores[target.key]
            out["targets"][target.key] = {
                "target_ms": target.target_ms,
                **_share(score.judged, score.met),
                "worst_ms": score.worst_ms,
                "worst_end_s": score.worst_end_s,
            }
        return out


def _share(judged: int, met: int) -> dict[str, Any]:
    return {"judged": judged, "met": met, "met_share": met / judged if judged else None}
