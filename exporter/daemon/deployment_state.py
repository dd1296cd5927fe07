"""Per-deployment state the daemon owns, and its saved form: what survives a restart."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from exporter.collector.demand import DemandSource, DemandWatch
from exporter.collector.observations import DeploymentObservation, WindowTracker
from exporter.collector.sources import Source
from exporter.config.values import DeploymentConfig
from exporter.daemon.state_bounds import out_of_bounds
from exporter.sizing.attainment import SloWindow
from exporter.sizing.handover import Handover, TrustedEstimate
from exporter.sizing.headroom import HeadroomController
from exporter.sizing.recommender import Recommender, preempted, waiting_queue_grows
from exporter.sizing.traffic import ModelInputs, TrafficTracker
from model import Observation, ServiceParams, Workload
from model.calibration.batch_rate import batch_rate_rps, lifetime_s
from model.calibration.prior import default_prior
from model.calibration.tuner import Tuner

logger = logging.getLogger(__name__)

SHAPE_WINDOWS = 6  # windows whose request shapes are averaged into the workload sized for
RATE_WINDOWS = 20  # windows whose arrival rates a tuner point's rate may span
# Tuner points whose misses bound the capacity (exporter.sizing.evidence.with_past_misses): an
# hour of 30 s cycles, longer than the tuner's window on purpose.
EVIDENCE_WINDOWS = 120


@dataclass(slots=True)
class DeploymentRuntime:
    """Mutable per-deployment state owned by the daemon."""

    config: DeploymentConfig
    source: Source
    tuner: Tuner
    recommender: Recommender
    tracker: WindowTracker
    workload: Workload | None = None
    observation: DeploymentObservation | None = field(default=None)
    pending_read: Future[Any] | None = None  # the source read in flight (reader thread)
    demand: DemandSource | None = None  # the demand query, with scale_from_zero
    demand_watch: DemandWatch | None = None  # with scale_from_zero
    demand_value: float | None = None  # the last cycle's demand (None: failed or not read)
    traffic: TrafficTracker = field(default_factory=TrafficTracker)
    inputs: ModelInputs | None = None  # what the model was last evaluated with
    # (input tokens, output tokens, completions) of recent windows: the shape sized for.
    shapes: deque[tuple[float, float, float]] = field(
        default_factory=lambda: deque(maxlen=SHAPE_WINDOWS)
    )
    # (per-replica arrival rate, window length in s) of recent windows, oldest first: a tuner
    # point's rate spans its window and a request lifetime before it.
    rates: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=RATE_WINDOWS))
    slo_window: SloWindow = field(init=False)  # latency histograms over slo_window_s
    trusted: TrustedEstimate = field(default_factory=TrustedEstimate)
    evidence: deque[Observation] = field(default_factory=lambda: deque(maxlen=EVIDENCE_WINDOWS))
    headroom: HeadroomController = field(init=False)  # the capacity factor from misses

    def __post_init__(self) -> None:
        self.slo_window = SloWindow(self.config.slo.window_s)
        self.headroom = HeadroomController(self.config.slo)

    def note_shape(self, obs: DeploymentObservation) -> None:
        """Add a window's request shape; the workload becomes the completion-weighted mean of
        the last SHAPE_WINDOWS: one window's means carry sampling noise (a few dozen long
        requests) that would move the SLO capacity from cycle to cycle. A ValueError (the
        shape is dropped) when its means are not usable."""
        if obs.avg_input_tokens is None or obs.avg_output_tokens is None:
            return
        shape = Workload(obs.avg_input_tokens, max(obs.avg_output_tokens, 1.0))
        weight = max(obs.completion_rate_rps * obs.window_s, 1.0)
        self.shapes.append((shape.avg_input_tokens, shape.avg_output_tokens, weight))
        rows = np.array(self.shapes)
        n, m = np.average(rows[:, :2], axis=0, weights=rows[:, 2])
        self.workload = Workload(float(n), float(m))

    def note_rate(self, obs: DeploymentObservation) -> None:
        """Add a window's per-replica arrival rate to the recent ones."""
        per_pod = obs.arrival_rate_per_pod_rps
        if per_pod is not None and obs.window_s > 0:
            self.rates.append((per_pod, obs.window_s))

    def handover(self) -> Handover | None:
        """What the sizer counts on while the calibration has no estimate of its own and none
        it trusted (None: it has one). An estimate not trusted yet still sizes, bounded by its
        own windows' evidence (exporter.sizing.evidence): a fit at one operating point is
        never trusted on its own, and the prior knows this fleet less than that fit does."""
        tuner = self.tuner
        if self.trusted.note(tuner.confidence(), tuner.params) or tuner.params is not None:
            return None
        return self.trusted.handover(tuner.initial, tuner.prior.centre)

    @property
    def slope_known(self) -> bool:
        """How latency grows with load is known beyond the tuner's window: an estimate was
        trusted since the start, or the operator configured `initial_params`; either holds the
        tuner's prior where a partial fit leaves it open (exporter.sizing.evidence)."""
        return self.trusted.params is not None or self.config.initial_params is not None

    @property
    def params(self) -> ServiceParams | None:
        """The tuner's estimate (it starts from the configured initial parameters, if any)."""
        return self.tuner.params


def new_tuner(dep: DeploymentConfig, seed: ServiceParams | None = None) -> Tuner:
    """A fresh tuner for a deployment, seeded with `seed` or its configured initial parameters
    (a seed is the fit's prior centre, not a pin); without one the prior is the physical one
    of the served model on the accelerator, when both are configured."""
    return Tuner(
        dep.server,
        initial=seed or dep.initial_params,
        min_observations=dep.tuner.min_observations,
        window_size=dep.tuner.window,
        options=dep.model,
        prior=default_prior(dep.model.architecture, dep.accelerator),
    )


def tuner_observation(
    obs: DeploymentObservation,
    max_batch_size: int,
    cvs: Mapping[str, float] | None = None,
    recent_rates: Sequence[tuple[float, float]] = (),
) -> Observation | None:
    """The per-replica point a steady, fully observed window gives the tuner, with the workload
    CVs the model uses for it (`cvs`, by ModelOptions field name); its rate spans the window and
    a request lifetime before it (model/calibration/batch_rate.py) over `recent_rates`
    ((per-replica rate, window s), oldest first, ending with this window's), or is the window's
    own without them; its occupancy rate is the requests the pods held (running + waiting, per
    pod) over that lifetime. None without latencies or request shape; a ValueError when a value
    is not usable."""
    cvs = cvs or {}
    rate_rps = obs.arrival_rate_per_pod_rps  # None without an observed pod
    if obs.ttft_ms is None or obs.itl_ms is None or rate_rps is None:
        return None
    if obs.avg_input_tokens is None or obs.avg_output_tokens is None:
        return None
    life = lifetime_s(obs.ttft_ms, obs.itl_ms, obs.avg_output_tokens)
    if recent_rates:
        rate_rps = batch_rate_rps(recent_rates, life)
    running = obs.avg_running_per_pod
    held = None if running is None else running + (obs.avg_waiting_per_pod or 0.0)
    return Observation(
        rate_rps=rate_rps,
        avg_input_tokens=obs.avg_input_tokens,
        avg_output_tokens=obs.avg_output_tokens,
        ttft_ms=obs.ttft_ms,
        itl_ms=obs.itl_ms,
        max_batch_size=max_batch_size,
        timestamp=obs.end_time_s,
        queue_growing=waiting_queue_grows(obs) or preempted(obs),
        input_length_cv=cvs.get("input_length_cv"),
        output_length_cv=cvs.get("output_length_cv"),
        arrival_cv=cvs.get("arrival_cv"),
        # The window's own share, not the smoothed one: the point's TTFT was made by it.
        prefix_hit_ratio=obs.cached_prompt_ratio if "prefix_hit_ratio" in cvs else None,
        occupancy_rate_rps=held / life if held else None,
    )


def steady(
    recent_rates: Sequence[tuple[float, float]], obs: DeploymentObservation, max_change: float
) -> bool:
    """Whether the per-pod load over the window and a request lifetime before it (`recent_rates`:
    (per-pod rate, window s), oldest first, ending with this window's) is within `max_change`
    of the window's own: the load the window's latencies were made at is the window's."""
    if not recent_rates or obs.ttft_ms is None or obs.itl_ms is None:
        return False
    if obs.avg_output_tokens is None:
        return False
    life = lifetime_s(obs.ttft_ms, obs.itl_ms, max(obs.avg_output_tokens, 1.0))
    own, span = recent_rates[-1][0], batch_rate_rps(recent_rates, life)
    return abs(span - own) <= max_change * max(span, own)


def saved_state(runtimes: Mapping[str, DeploymentRuntime]) -> dict[str, Any]:
    """The JSON-safe state of every deployment: tuner, stabilization history, request shape."""
    state: dict[str, Any] = {"deployments": {}}
    for name, rt in runtimes.items():
        state["deployments"][name] = {
            "tuner": rt.tuner.to_dict(),
            "recommender": rt.recommender.to_dict(),
            "workload": None
            if rt.workload is None
            else [rt.workload.avg_input_tokens, rt.workload.avg_output_tokens],
        }
    return state


def restore_state(
    saved: Mapping[str, Any], runtimes: Mapping[str, DeploymentRuntime], now_s: float
) -> list[str]:
    """Restore each deployment found in `saved` at time `now_s` (s, the daemon's clock); an
    unusable entry is logged and skipped, whatever its shape. Returns why each skipped entry
    was unusable (empty: all restored)."""
    entries = saved.get("deployments", {})
    if not isinstance(entries, Mapping):
        logger.error("saved state unusable (`deployments` is not a mapping), starting fresh")
        return ["`deployments` is not a mapping"]
    problems: list[str] = []
    for name, rt in runtimes.items():
        entry = entries.get(name)
        if entry is None:
            continue  # a deployment added since the save
        if not isinstance(entry, Mapping):
            logger.error("%s: saved state unusable (not a mapping), starting fresh", name)
            problems.append(f"{name}: not a mapping")
            continue
        beyond = out_of_bounds(entry)
        if beyond is not None:
            logger.error(
                "%s: saved state beyond the config's bounds, starting fresh: %s", name, beyond
            )
            problems.append(f"{name}: {beyond}")
            continue
        try:
            tuner = Tuner.from_dict(entry["tuner"])
            shape = entry.get("workload")
            workload = None if shape is None else Workload(*shape)
            rt.recommender.restore(entry.get("recommender", {}), now_s)
        except (AttributeError, KeyError, OverflowError, TypeError, ValueError) as exc:
            # Any piece of the wrong shape or value; nothing is assigned before all of it parsed.
            # The message can quote a whole saved window: cut it.
            logger.error("%s: saved state unusable, starting fresh: %.200s", name, exc)
            problems.append(f"{name}: {str(exc):.200}")
            continue
        rt.tuner = (
            tuner if _same_settings(tuner, rt.tuner) else new_tuner(rt.config, seed=tuner.params)
        )
        rt.workload = workload
        logger.info("%s: restored calibration %s", name, rt.params)
    return problems


def _same_settings(restored: Tuner, configured: Tuner) -> bool:
    """Whether a saved tuner was built with today's configuration; if not (the window, the
    server or the model variant changed), the daemon starts a new one seeded with its estimate."""
    keys = ("server", "options", "window_size", "min_observations", "prior")
    return all(getattr(restored, k) == getattr(configured, k) for k in keys)
