"""Per-deployment state the daemon owns, and its saved form: what survives a restart."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from exporter.config import DeploymentConfig
from exporter.reading.demand import DemandSource, DemandWatch
from exporter.reading.observations import DeploymentObservation, WindowTracker
from exporter.reading.sources import Source
from exporter.recommender import Recommender
from exporter.traffic import ModelInputs, TrafficTracker
from model import ServiceParams, Workload
from model.calibration.tuner import Tuner

logger = logging.getLogger(__name__)


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
    previous_rate_rps: float | None = None
    pending_read: Future[Any] | None = None  # the source read in flight (reader thread)
    demand: DemandSource | None = None  # the demand query, with scale_from_zero
    demand_watch: DemandWatch | None = None  # with scale_from_zero
    demand_value: float | None = None  # the last cycle's demand (None: failed or not read)
    traffic: TrafficTracker = field(default_factory=TrafficTracker)
    inputs: ModelInputs | None = None  # what the model was last evaluated with

    @property
    def params(self) -> ServiceParams | None:
        """The tuner's estimate (it starts from the configured initial parameters, if any)."""
        return self.tuner.params


def new_tuner(dep: DeploymentConfig, seed: ServiceParams | None = None) -> Tuner:
    """A fresh tuner for a deployment, seeded with `seed` or its configured initial parameters."""
    return Tuner(
        dep.server,
        initial=seed or dep.initial_params,
        min_observations=dep.tuner.min_observations,
        window_size=dep.tuner.window,
        options=dep.model,
    )


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
) -> None:
    """Restore each deployment found in `saved` at time `now_s` (s, the daemon's clock); an
    unusable entry is logged and skipped, whatever its shape."""
    entries = saved.get("deployments", {})
    if not isinstance(entries, Mapping):
        logger.error("saved state unusable (`deployments` is not a mapping), starting fresh")
        return
    for name, rt in runtimes.items():
        entry = entries.get(name)
        if entry is None:
            continue  # a deployment added since the save
        if not isinstance(entry, Mapping):
            logger.error("%s: saved state unusable (not a mapping), starting fresh", name)
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
            continue
        rt.tuner = (
            tuner if _same_settings(tuner, rt.tuner) else new_tuner(rt.config, seed=tuner.params)
        )
        rt.workload = workload
        logger.info("%s: restored calibration %s", name, rt.params)


def _same_settings(restored: Tuner, configured: Tuner) -> bool:
    """Whether a saved tuner was built with today's configuration; if not (the window, the
    server or the model variant changed), the daemon starts a new one seeded with its estimate."""
    keys = ("server", "options", "window_size", "min_observations")
    return all(getattr(restored, k) == getattr(configured, k) for k in keys)
