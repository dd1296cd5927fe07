"""A window as a tuner point, whether its load was steady, and a deployment's first tuner. The
point is what a steady, fully observed window gives."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from exporter.collector.observations import DeploymentObservation
from exporter.config.values import DeploymentConfig
from exporter.sizing.recommender import preempted, waiting_queue_grows
from model import Observation, ServiceParams
from model.calibration.batch_rate import batch_rate_rps, lifetime_s
from model.calibration.prior import default_prior
from model.calibration.tuner import Tuner


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
        prior=default_prior(dep.model.architecture, dep.accelerator, dep.gpus_per_replica),
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
