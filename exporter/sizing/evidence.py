"""The evidence envelope: what a deployment's own recent windows say about one replica's SLO
capacity, whatever the model says. docs/concepts/evidence.md.

The points are the tuner's window (steady, fully observed windows since the last detected
change, per replica). Against the mean targets (TTFT, ITL), a point's overshoot is the larger
of measured / target; a point with an overshoot of at most 1 - NOISE_MARGIN was *served* within
the targets, one of at least 1 + NOISE_MARGIN *missed* them (between the two, a window's mean is
within its own noise of the target and says neither). Then:
- a rate served within the targets is within the capacity: capacity >= the highest served rate;
- a rate missed at is above it: capacity <= the lowest missed rate (the stronger bound when the
  two cross: it errs toward a replica more);
- the step the observed overload supports: capacity >= rate / (TTFT overshoot x (1 +
  NOISE_MARGIN)), the median over the newest OVERLOAD_POINTS points, when each of them missed
  the TTFT target (without an observed overload there is no step to bound; ITL, which grows
  about linearly with the batch from a large empty-engine part, supports no such floor: at
  128/2048 tokens a replica 1.5x over its ITL target served 2.1x its capacity). A replica
  30 % over its TTFT target at 11 req/s is sized as serving at least 11 / 1.43 within it, not
  the 0.03 req/s a fit at that one point may extrapolate to. A policy, not a measurement (how
  far latency falls with load depends on the part of it no load changes): it bounds the step
  from the current count; a higher model figure stands;
- saturation is not below a rate served without a growing queue (every point of the window).
A claim at a per-replica rate outside the points' rates is an extrapolation; how far
(`extrapolation_ratio`) is exported and answered with every what-if, and above the highest
rate a predicted latency is not below what the highest point measured (less its noise):
latency does not fall as load rises, whatever a fit at lower loads extrapolates.
A model capacity outside the envelope is moved to its edge and the count sized from that; the
decision's reason then says `evidence_bound`.

What is published (`Envelope.claim`: the capacity and saturation gauges, the what-if, `plan
--state`) is no more than the data identified. Windows at one operating point
(`trust.spread_loads` false), on a deployment whose growth with load nothing else holds (since
the start no fit identified every parameter and no window's rates spread beyond their
counting noise, no configured parameters: `slope_known`), pin the mean TTFT and ITL at that
load but not how they grow with it: every split of alpha against the load parts that predicts
the same point fits the windows, and the steepest (alpha near 0: throughput no longer grows
with the batch) saturates just past the observed load. A capacity beyond the points' rates is
then cut to the highest rate served within the targets and a saturation beyond them to the
highest rate served stably: lower bounds the windows proved, where the model's figure is an
extrapolation no window tested (the laptop recipe's fit claimed 2-2.7x its observed load,
1.2-2x the simulator's truth); a figure within the rates is one the windows around it test,
and stays. A what-if beyond the published saturation answers no latency and no stability
(`WhatIf.stable` None): the windows cannot tell. The count is not sized on the claim: below
the current count it steps within `scale_down_floor`, and the next windows test each step
(sizing on a ceiling near the rate served held a steady fleet above its need: the real
conversation trace cost 1.54x the best fixed fleet instead of 1.17x). Cutting every figure past
the rate served, with the tuner's ten points as the only test of spread, moved the gauges with
the load at 128/2048 tokens, whose slow wander does not spread ten points
(bench/tuner_robustness: p90 move 2.0 -> 9.3 %); the hour's spread (`spread_over_history`)
and the cut beyond the rates only keep them as steady as the model's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from exporter.collector.observations import DeploymentObservation
from exporter.collector.saturation import Saturation
from exporter.config.values import SloConfig
from exporter.sizing.forecast import Forecast
from model.calibration.estimate import TunerEstimate
from model.calibration.medians import median, percentiles
from model.calibration.observation import Observation
from model.calibration.trust import SPREAD_QUANTILES, SPREAD_RATIO, spread_loads

NOISE_MARGIN = 0.1
SCALE_DOWN_STEP = 1.5  # see scale_down_floor
OVERLOAD_POINTS = 3
# holds_load: a batch at most this share of max_num_seqs, and fewer requests waiting than this
# (per pod, mean over the window), leave the room a load served within the targets needs.
BATCH_MARGIN = 0.5
MIN_WAITING = 1.0
# ... and arrivals no burstier than this inter-arrival CV (Poisson: 1).
BURSTY_ARRIVAL_CV = 2.0
# A claim this far outside the observed rates (as a ratio) is flagged extrapolated; inside it,
# a window's own rate noise covers the distance.
EXTRAPOLATED_RATIO = 1.0 + NOISE_MARGIN
QUARTILE_Z = 0.8416  # the standard normal's 80th percentile (spread_beyond_noise)
NOISE_MIN_POINTS = 5  # fewer points' percentiles say nothing of a spread
# spread_over_history: at least this many points (fewer points' percentiles, at 35-45 requests a
# window, put one constant load past SPREAD_RATIO in 1-3 % of draws; 60, in 0.2 % at most).
HISTORY_MIN_POINTS = 60


@dataclass(frozen=True, slots=True, kw_only=True)
class Envelope:
    """Per-replica rates (req/s) the points bound one replica's capacity and saturation by;
    None where no point says anything."""

    served_rps: float | None  # the highest rate served within the targets
    missed_rps: float | None  # the lowest rate at which they were missed
    overload_floor_rps: float | None  # rate / TTFT overshoot of the newest if all missed
    stable_rps: float | None  # the highest rate served without a growing queue
    low_rps: float | None  # the lowest rate of any point
    high_rps: float | None  # the highest rate of any point
    # Measured at the highest rate, less NOISE_MARGIN (ms): what a higher load is not below.
    top_ttft_ms: float | None = None
    top_itl_ms: float | None = None
    # The points' loads spread beyond one operating point (how latency grows is identified).
    spread: bool = False

    def unidentified(self, slope_known: bool) -> bool:
        """How latency grows with load is known neither beyond the points (not `slope_known`)
        nor from them (they sit at one operating point)."""
        return not (slope_known or self.spread) and self.high_rps is not None

    def within(self, rate_rps: float) -> bool:
        """`rate_rps` lies within the points' rates, their noise included (an extrapolation
        ratio of at most EXTRAPOLATED_RATIO)."""
        ratio = self.extrapolation_ratio(rate_rps)
        return ratio is not None and ratio <= EXTRAPOLATED_RATIO

    def claim(
        self, capacity_rps: float, saturation_rps: float, slope_known: bool
    ) -> tuple[float, float]:
        """The (capacity, saturation) published for the envelope's (module docstring): with the
        growth with load not identified (not `slope_known`, points at one operating point), a
        figure beyond the points' rates is cut to what they proved, the capacity to the highest
        rate served within the targets and the saturation to the highest rate served stably
        (not below the capacity); a figure within the rates (the windows test it), or with the
        growth identified, is the model's."""
        if not self.unidentified(slope_known):
            return capacity_rps, saturation_rps
        capacity, saturation = capacity_rps, saturation_rps
        if self.served_rps is not None and not self.within(capacity_rps):
            capacity = min(capacity_rps, self.served_rps)
        if self.stable_rps is not None and not self.within(saturation_rps):
            saturation = min(saturation_rps, self.stable_rps)
        return capacity, max(capacity, saturation)

    def capacity(self, model_rps: float) -> float:
        """`model_rps` moved into the envelope (the missed bound wins a crossing)."""
        floor = max(
            (v for v in (self.served_rps, self.overload_floor_rps) if v is not None),
            default=None,
        )
        capacity = model_rps if floor is None else max(model_rps, floor)
        return capacity if self.missed_rps is None else min(capacity, self.missed_rps)

    def extrapolation_ratio(self, rate_rps: float | None) -> float | None:
        """How far `rate_rps` lies outside the points' rates: rate / highest above them,
        lowest / rate below them, 1 within; None without a rate or points."""
        if rate_rps is None or self.low_rps is None or self.high_rps is None:
            return None
        if rate_rps > self.high_rps:
            return rate_rps / self.high_rps
        return self.low_rps / rate_rps if 0 < rate_rps < self.low_rps else 1.0

    def saturation(self, model_rps: float) -> float:
        """`model_rps`, but not below a rate served stably."""
        return model_rps if self.stable_rps is None else max(model_rps, self.stable_rps)


@dataclass(frozen=True, slots=True, kw_only=True)
class Bounded:
    """A count and the per-replica capacity and saturation (req/s) it was sized with, and
    whether the envelope moved the model's capacity."""

    replicas: int | None
    capacity_rps: float
    saturation_rps: float
    bound: bool
    # What is published (`Envelope.claim`): at most capacity_rps and saturation_rps.
    claimed_rps: float = math.nan
    claimed_saturation_rps: float = math.nan
    unidentified: bool = False  # Envelope.unidentified
    # How far capacity_rps lies outside the points' rates (Envelope.extrapolation_ratio; None
    # without points): beyond EXTRAPOLATED_RATIO the published capacity is an extrapolation, or
    # with the growth unidentified the bound the claim cut it to.
    extrapolation_ratio: float | None = None


def overshoot(point: Observation, ttft_ms: float | None, itl_ms: float | None) -> float | None:
    """The larger of measured / target over the mean targets set; None without one."""
    ratios = [
        measured / target
        for measured, target in ((point.ttft_ms, ttft_ms), (point.itl_ms, itl_ms))
        if target is not None
    ]
    return max(ratios) if ratios else None


def served(ratio: float | None) -> bool:
    return ratio is not None and ratio <= 1.0 - NOISE_MARGIN


def missed(ratio: float | None) -> bool:
    return ratio is not None and ratio >= 1.0 + NOISE_MARGIN


def envelope(points: Sequence[Observation], slo: SloConfig) -> Envelope:
    """The envelope of `points` (oldest first) against the mean targets of `slo`."""
    ttft_ms, itl_ms = slo.ttft_ms, slo.itl_ms
    rates = [p.rate_rps for p in points]
    top = max(points, key=lambda p: p.rate_rps, default=None)
    ratios = [overshoot(p, ttft_ms, itl_ms) for p in points]
    stable = [r for p, r in zip(points, rates, strict=True) if not p.queue_growing]
    queueing = [overshoot(p, ttft_ms, None) for p in points[-OVERLOAD_POINTS:]]
    newest = [
        rate / (ratio * (1.0 + NOISE_MARGIN))
        for rate, ratio in zip(rates[-OVERLOAD_POINTS:], queueing, strict=True)
        if ratio is not None and missed(ratio)
    ]
    return Envelope(
        served_rps=max((r for r, o in zip(rates, ratios, strict=True) if served(o)), default=None),
        missed_rps=min((r for r, o in zip(rates, ratios, strict=True) if missed(o)), default=None),
        overload_floor_rps=float(np.median(newest)) if len(newest) == OVERLOAD_POINTS else None,
        stable_rps=max(stable, default=None),
        low_rps=min(rates, default=None),
        high_rps=max(rates, default=None),
        top_ttft_ms=None if top is None else top.ttft_ms * (1.0 - NOISE_MARGIN),
        top_itl_ms=None if top is None else top.itl_ms * (1.0 - NOISE_MARGIN),
        spread=spread_loads(np.array(rates, dtype=float)),
    )


def bounded(
    outlook: Forecast,
    sizing_rate_rps: float,
    env: Envelope,
    current: int | None = None,
    headroom: float = 1.0,
    *,
    slope_known: bool = True,
    evidence_rate_rps: float | None = None,
) -> Bounded:
    """The forecast's count, capacity and saturation (per replica) checked against `env`:
    where the capacity leaves the envelope, it is moved to the edge and the count becomes what
    the sizing rate needs at it; below `current` replicas, not past `scale_down_floor`; the
    claim published from them (`Envelope.claim`). `headroom` is the factor `sizing_rate_rps`
    carries (exporter.sizing.headroom): it corrects the model for misses the model does not
    explain. A rate missed at is such a miss already counted: when it is the edge the capacity
    moves to, the rate is sized without the factor (not below the model's own count). Counted
    twice, one burst window that missed took a bursty trace's count from 4 to 6 replicas for
    the next hour. At that edge the rate sized is `evidence_rate_rps` (the recommender's
    `evidence_rate`: its look-ahead without the slope its windows' noise explains), when
    given."""
    replicas, capacity_rps = outlook.plan.replicas, outlook.plan.capacity.rate_rps
    saturation = env.saturation(outlook.saturation_rate_per_replica_rps)
    capacity = env.capacity(capacity_rps)
    bound = not (math.isclose(capacity, capacity_rps) or capacity <= 0)
    if bound:
        missed_edge = env.missed_rps is not None and math.isclose(capacity, env.missed_rps)
        at_edge = sizing_rate_rps if evidence_rate_rps is None else evidence_rate_rps
        rate = at_edge / headroom if missed_edge else sizing_rate_rps
        replicas = max(1, math.ceil(rate / capacity - 1e-9))
        if missed_edge and outlook.plan.replicas is not None:
            replicas = max(replicas, outlook.plan.replicas)
    else:
        capacity = capacity_rps
    if replicas is not None and current is not None and replicas < current:
        floor = min(current, scale_down_floor(sizing_rate_rps, env))
        if floor > replicas:
            replicas, bound = floor, True
    claimed, claimed_saturation = env.claim(capacity, saturation, slope_known)
    return Bounded(
        replicas=replicas, capacity_rps=capacity, saturation_rps=saturation, bound=bound,
        claimed_rps=claimed, claimed_saturation_rps=claimed_saturation,
        unidentified=env.unidentified(slope_known),
        extrapolation_ratio=env.extrapolation_ratio(capacity),
    )  # fmt: skip


def scale_down_floor(sizing_rate_rps: float, env: Envelope) -> int:
    """The fewest replicas a scale-down may go to: each may carry at most SCALE_DOWN_STEP x the
    highest per-replica rate the windows served within the targets (1 without such a rate).
    Past it the model's claim is an extrapolation no window has tested; a scale-down into it
    that misses comes straight back up, a cycle at constant load. Steps within it add windows
    at the new rate, so a fleet larger than it needs comes down step by step."""
    if env.served_rps is None or env.served_rps <= 0:
        return 1
    return max(1, math.ceil(sizing_rate_rps / (env.served_rps * SCALE_DOWN_STEP) - 1e-9))


def latency_floor_ms(
    rate_rps: float, ttft_ms: float, itl_ms: float, env: Envelope
) -> tuple[float, float]:
    """Predicted (TTFT, ITL) at a per-replica `rate_rps`, not below what the highest point
    measured (less its noise) when the rate is above it."""
    if env.high_rps is None or rate_rps <= env.high_rps:
        return ttft_ms, itl_ms
    return max(ttft_ms, env.top_ttft_ms or 0.0), max(itl_ms, env.top_itl_ms or 0.0)


def capacity_extrapolated(ratio: float | None) -> bool | None:
    """An extrapolation ratio beyond EXTRAPOLATED_RATIO: the capacity lies outside the windows'
    rates (None without windows)."""
    return None if ratio is None else ratio > EXTRAPOLATED_RATIO


def extrapolation_ratio(rate_rps: float | None, points: Sequence[Observation]) -> float | None:
    """`Envelope.extrapolation_ratio` of `points` (no targets needed)."""
    return envelope(points, SloConfig()).extrapolation_ratio(rate_rps)


@dataclass(frozen=True, slots=True)
class PastMiss:
    """A window that missed the mean targets and has left the tuner's window: `pods` replicas
    missed at `rate_rps` in all (req/s)."""

    rate_rps: float
    pods: int


def past_misses(
    window: Sequence[Observation],
    history: Sequence[tuple[Observation, int]],
    slo: SloConfig,
) -> tuple[PastMiss, ...]:
    """The points of `history` ((point, pods that served it), older and longer than `window`)
    that missed the targets and are no longer in `window`, as the counts that missed.

    A miss bounds the capacity per replica while it is in the window; once the window has
    slid past it, it bounds the count only (`miss_floor`). Were it forgotten, a count sized on
    a guess the miss disproved would return, miss again, and the count would cycle at constant
    load. Kept as a per-replica bound for the hour instead, one window of bursts or of
    heavy-tailed prompts that missed at N replicas sized every later window at the rate of
    that one window: a conversation trace missed its ITL once at 4 replicas (0.76 req/s per
    replica) and was then sized at 7-8 for the 40 minutes left, where a fixed 5 met 99 % of
    its windows.

    A miss that a count as small served at a rate as high contradicts (in `history`, before
    or after it) is not the rate's: bursts inside its window or a run of long prompts missed
    there, and the latency histograms' headroom factor (exporter.sizing.headroom) answers
    those. Kept, one burst window that missed at 4 replicas of a bursty trace (14.9 req/s,
    where 4 had served 14.2 within the targets) held 5 for the 20 minutes left whenever a
    window's rate reached it, where a fixed 4 met 98 % of the windows."""
    kept = set(map(id, window))
    ratios = [overshoot(point, slo.ttft_ms, slo.itl_ms) for point, _ in history]
    served_at = [
        (point.rate_rps * pods, pods)
        for (point, pods), ratio in zip(history, ratios, strict=True)
        if served(ratio)
    ]
    return tuple(
        PastMiss(point.rate_rps * pods, pods)
        for (point, pods), ratio in zip(history, ratios, strict=True)
        if id(point) not in kept and missed(ratio)
        and not any(n <= pods and rate >= point.rate_rps * pods for rate, n in served_at)
    )  # fmt: skip


def miss_floor(rate_rps: float, misses: Sequence[PastMiss]) -> int:
    """The fewest replicas for a total `rate_rps` the past misses allow: one more than any
    count that missed at that rate or below it (1 without one)."""
    return max((m.pods + 1 for m in misses if rate_rps >= m.rate_rps), default=1)


def holds_load(
    obs: DeploymentObservation,
    replicas: int | None,
    slo: SloConfig,
    max_batch: int,
    arrival_cv: float = 1.0,
) -> bool:
    """The window says its ready replicas serve the load and `replicas` more than them is a
    step up no evidence asks for: their mean latencies were within the mean targets with the
    noise margin, no request waited for a batch slot, the running batch filled at most
    BATCH_MARGIN of `max_batch`, the KV cache held (no preemption) and no pod joined.
    A load a fleet served within the targets is within its capacity, whatever a model the
    fleet has not confirmed says. The batch bound is the other margin: vLLM admits at most
    `max_batch` sequences and past them arrivals wait, a cliff no mean latency shows ahead; and
    a batch still filling (one replica at 11 req/s of 512-token answers ran 93, 117, 152, 192
    sequences in its first windows, then missed) is a transient whose latencies are not yet
    those of its load. Arrivals burstier than BURSTY_ARRIVAL_CV (`arrival_cv`, measured or
    configured) hold nothing: one window's mean latencies do not vouch for the next, and a
    bursty fleet held at one replica gives its tuner one operating point only (3 req/s at
    arrival CV 3 held at 1 replica: 14-49 % off the true capacity after 20 windows, over 20 %
    in 3 of 5 seeds; stepped up to 2 and back, within 4 % in all 5)."""
    current = obs.ready_pods
    if replicas is None or current < 1 or replicas <= current or arrival_cv > BURSTY_ARRIVAL_CV:
        return False
    if obs.new_pods or Saturation.PREEMPTIONS in obs.saturation:
        return False
    waiting, running = obs.avg_waiting_per_pod, obs.avg_running_per_pod
    if waiting is None or waiting >= MIN_WAITING or running is None:
        return False
    if running > BATCH_MARGIN * max_batch:
        return False
    ratios = [
        measured / target
        for measured, target in ((obs.ttft_ms, slo.ttft_ms), (obs.itl_ms, slo.itl_ms))
        if target is not None and measured is not None
    ]
    return bool(ratios) and served(max(ratios))


def identifies_growth(estimate: TunerEstimate, window_s: float, pods: int) -> bool:
    """The estimate's data say how latency grows with load: its fit identified every parameter,
    or its window's arrival rates spread over more than one operating point by more than the
    counting noise of `window_s` windows over `pods` pods explains (`spread_beyond_noise`)."""
    if estimate.params is not None and all(estimate.identified):
        return True
    rates = np.array([p.rate_rps for p in estimate.window], dtype=float)
    return spread_beyond_noise(rates, window_s, pods)


def spread_beyond_noise(rates_rps: NDArray[np.float64], window_s: float, pods: int) -> bool:
    """`trust.spread_loads` of per-replica rates counted over `window_s` windows across `pods`,
    with the ratio asked for widened by what the count's Poisson noise alone spreads them to:
    at one constant load a window of n requests has a relative sd of 1 / sqrt(n), and the
    20th-80th percentile ratio of such windows is about exp(2 x 0.84 / sqrt(n)): 1.22 at the
    laptop recipe's 70 requests, 1.33 at 35 (one replica at 7 req/s over 5 s), where the
    ratio alone (SPREAD_RATIO, 1.3) calls one load spread."""
    finite = rates_rps[np.isfinite(rates_rps) & (rates_rps > 0)]
    if finite.size < NOISE_MIN_POINTS or window_s <= 0 or pods < 1:
        return False
    count = median(finite) * window_s * pods
    noise = math.exp(2.0 * QUARTILE_Z / math.sqrt(max(count, 1.0)))
    low, high = percentiles(finite, SPREAD_QUANTILES)
    return bool(high >= SPREAD_RATIO * noise * low)


def spread_over_history(history: Sequence[tuple[Observation, int]], window_s: float) -> bool:
    """The per-replica rates of `history` ((point, pods that served it), oldest first; the
    cycle's hour of tuner points, longer than the tuner's window) spread over more than one
    operating point: their 20th-80th percentile ratio, with the Poisson noise of counting
    `window_s` windows taken out of it (log-normal widths add in variance), is at least
    SPREAD_RATIO. `spread_beyond_noise`, on the tuner's ten points, asks the noise's width on
    top of the ratio instead (a few points' percentiles are themselves noisy); a load that
    wanders slowly never shows in ten points, and over an hour it does: at 128/2048 tokens a
    load drawn over 0.3-0.7 of saturation every 10 minutes is called spread after 60-83 windows
    (three seeds); one constant load over an hour, at 40-260 requests a window, reaches 1.13 at
    most (12 runs)."""
    if len(history) < HISTORY_MIN_POINTS or window_s <= 0:
        return False
    rates = np.array([p.rate_rps for p, _ in history], dtype=float)
    counts = np.array([p.rate_rps * window_s * max(pods, 1) for p, pods in history], dtype=float)
    ok = np.isfinite(rates) & (rates > 0)
    if np.count_nonzero(ok) < HISTORY_MIN_POINTS:
        return False
    low, high = np.percentile(rates[ok], SPREAD_QUANTILES)
    width = math.log(high / low) / (2.0 * QUARTILE_Z)  # the log-rates' sd the percentiles give
    noise = 1.0 / float(np.median(np.maximum(counts[ok], 1.0)))  # Poisson: var(log n) ~ 1 / n
    loads = math.sqrt(max(width * width - noise, 0.0))
    return math.exp(2.0 * QUARTILE_Z * loads) >= SPREAD_RATIO
