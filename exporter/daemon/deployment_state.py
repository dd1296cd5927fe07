"""Per-deployment state the daemon owns, and its saved form: what survives a restart."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from exporter.collector.demand import DemandSource, DemandWatch
from exporter.collector.observations import DeploymentObservation, WindowTracker
from exporter.collector.sources import Source
from exporter.config.values import DeploymentConfig
from exporter.daemon.state_bounds import out_of_bounds
from exporter.sizing.cycle import DeploymentCycle
from exporter.sizing.fleet_cycle import FleetSizer
from exporter.sizing.points import new_tuner
from model import Workload
from model.calibration.tuner import Tuner

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class DeploymentRuntime:
    """What the daemon keeps per deployment beside its sizing state (`cycle`): its source and
    window tracker, the read in flight, the demand query, and this cycle's observation."""

    config: DeploymentConfig
    source: Source
    tracker: WindowTracker
    cycle: DeploymentCycle
    observation: DeploymentObservation | None = field(default=None)
    pending_read: Future[Any] | None = None  # the source read in flight (reader thread)
    demand: DemandSource | None = None  # the demand query, with scale_from_zero
    demand_watch: DemandWatch | None = None  # with scale_from_zero
    demand_value: float | None = None  # the last cycle's demand (None: failed or not read)


def saved_state(
    cycles: Mapping[str, DeploymentCycle], fleet: FleetSizer | None = None
) -> dict[str, Any]:
    """The JSON-safe state of every deployment: tuner, stabilization history, the forecasters'
    rate history, request shape; and the fleet plan's (`fleet`), when there is one."""
    state: dict[str, Any] = {"deployments": {}}
    if fleet is not None:
        state["fleet"] = fleet.to_dict()
    for name, rt in cycles.items():
        state["deployments"][name] = {
            "tuner": rt.tuner.to_dict(),
            "recommender": rt.recommender.to_dict(),
            "forecaster": rt.forecaster.to_dict(),
            "workload": None
            if rt.workload is None
            else [rt.workload.avg_input_tokens, rt.workload.avg_output_tokens],
            "slope_known": rt.growth_seen,  # what the windows identified (DeploymentCycle)
        }
    return state


def restore_state(
    saved: Mapping[str, Any], cycles: Mapping[str, DeploymentCycle], now_s: float
) -> list[str]:
    """Restore each deployment found in `saved` at time `now_s` (s, the daemon's clock); an
    unusable entry is logged and skipped, whatever its shape. Returns why each skipped entry
    was unusable (empty: all restored)."""
    entries = saved.get("deployments", {})
    if not isinstance(entries, Mapping):
        logger.error("saved state unusable (`deployments` is not a mapping), starting fresh")
        return ["`deployments` is not a mapping"]
    problems: list[str] = []
    for name, rt in cycles.items():
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
            growth_seen = entry.get("slope_known", False)
            if not isinstance(growth_seen, bool):
                raise ValueError(f"slope_known must be true or false, got {growth_seen!r}")
            rt.forecaster.restore(entry.get("forecaster"), now_s)  # drops what does not parse
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
        rt.growth_seen = growth_seen
        logger.info("%s: restored calibration %s", name, rt.params)
    return problems


def restore_fleet(saved: Mapping[str, Any], fleet: FleetSizer, now_s: float) -> list[str]:
    """Restore the fleet plan's state from `saved` (none saved: nothing to do); an unusable
    one is logged and the plan starts fresh. Returns why it was unusable (empty: restored)."""
    entry = saved.get("fleet")
    if entry is None:
        return []
    try:
        if not isinstance(entry, Mapping):
            raise TypeError("not a mapping")
        fleet.restore(entry, now_s)
    except (AttributeError, KeyError, OverflowError, TypeError, ValueError) as exc:
        logger.error("fleet plan: saved state unusable, starting fresh: %.200s", exc)
        return [f"fleet: {str(exc):.200}"]
    logger.info("fleet plan: restored")
    return []


def _same_settings(restored: Tuner, configured: Tuner) -> bool:
    """Whether a saved tuner was built with today's configuration; if not (the window, the
    server or the model variant changed), the daemon starts a new one seeded with its estimate."""
    keys = ("server", "options", "window_size", "min_observations", "prior")
    return all(getattr(restored, k) == getattr(configured, k) for k in keys)
