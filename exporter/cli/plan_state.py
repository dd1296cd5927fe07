"""`vllm-sizer plan --state`: one deployment's calibration read from a daemon's state file, and
where its windows put the plan's claims (exporter/sizing/evidence.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from exporter.config.values import SloConfig
from exporter.sizing.evidence import EXTRAPOLATED_RATIO, Envelope, envelope
from model import Observation, ServiceParams, Workload
from model.calibration.trust import is_trusted
from model.calibration.tuner import Tuner


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibrated:
    """What a state file holds of one deployment's calibration."""

    name: str
    params: ServiceParams | None
    workload: Workload | None
    trusted: bool
    window: tuple[Observation, ...]  # the tuner's points, oldest first
    slope_known: bool = False  # DeploymentCycle.slope_known, as the daemon saved it


def read_state(path: Path, name: str | None) -> Calibrated:
    """Deployment `name` (None: the only one) of the daemon's state file at `path`; ValueError
    naming what is missing or unusable."""
    try:
        saved = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--state {path}: unreadable: {exc}") from exc
    state = saved.get("state") if isinstance(saved, Mapping) else None
    entries = state.get("deployments") if isinstance(state, Mapping) else None
    if not isinstance(entries, Mapping) or not entries:
        raise ValueError(f"--state {path}: no deployments in it (not a vllm-sizer state file?)")
    if name is None:
        if len(entries) > 1:
            raise ValueError(f"--state {path}: holds {sorted(entries)}; name one with --deployment")
        (name,) = entries
    entry = entries.get(name)
    if not isinstance(entry, Mapping):
        raise ValueError(f"--deployment {name!r}: not in --state {path} (it has {sorted(entries)})")
    try:
        tuner = Tuner.from_dict(entry["tuner"])
        shape = entry.get("workload")
        workload = None if shape is None else Workload(*shape)
        slope_known = entry.get("slope_known", False)
        if not isinstance(slope_known, bool):
            raise ValueError(f"slope_known must be true or false, got {slope_known!r}")
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"--state {path}: deployment {name!r} unusable: {exc!s:.200}") from exc
    estimate = tuner.estimate()
    return Calibrated(
        name=name, params=estimate.params, workload=workload,
        trusted=is_trusted(estimate.confidence), window=estimate.window, slope_known=slope_known,
    )  # fmt: skip


def print_evidence(
    calibrated: Calibrated, slo: SloConfig, capacity_rps: float, saturation_rps: float
) -> Envelope:
    """Print where the state's windows put the claims (exporter/sizing/evidence.py): the
    observed per-replica rates, how far the SLO capacity lies from them, and the capacity and
    saturation the daemon publishes from the same windows."""
    env = envelope(calibrated.window, slo)
    trust = "trusted" if calibrated.trusted else "not trusted"
    if env.low_rps is None or env.high_rps is None:
        print(f"observed ({calibrated.name}, {trust}): no windows; every claim is an extrapolation")
        return env
    print(
        f"observed ({calibrated.name}, {trust}): {len(calibrated.window)} windows at "
        f"{env.low_rps:.4g}-{env.high_rps:.4g} req/s per replica"
    )
    ratio = env.extrapolation_ratio(capacity_rps)
    said = "extrapolated" if ratio is None or ratio > EXTRAPOLATED_RATIO else "within them"
    print(f"SLO capacity's extrapolation ratio: {ratio:.3g} ({said})")
    bounded_rps = env.capacity(capacity_rps)
    published, saturation = env.claim(
        bounded_rps, env.saturation(saturation_rps), calibrated.slope_known
    )
    if abs(published - capacity_rps) > 1e-9 * capacity_rps:
        print(
            f"capacity the daemon publishes from these windows: {published:.4g} req/s "
            f"(extrapolation ratio {env.extrapolation_ratio(published):.3g}), saturation "
            f"{saturation:.4g} req/s (docs/concepts/evidence.md)"
        )
    return env


def distance(env: Envelope | None, rate_rps: float) -> str:
    """The table's extrapolation cell for a per-replica rate ('' without --state)."""
    if env is None:
        return ""
    ratio = env.extrapolation_ratio(rate_rps)
    return " | none observed" if ratio is None else f" | {ratio:13.3g}"
