"""Replay arms that differ only in the look-ahead's forecaster: each a variant of ours
(exporter.replay.policies.OursPolicy) sizing with one forecaster, or with the one its own
backtest picks (`auto`: exporter.sizing.forecast_choice), on the same deployment, observer
and HPA as the `ours` arm. A history read before the replay (earlier days of the trace, as
the state file would restore them) can be handed to every arm's forecaster first."""

from __future__ import annotations

from collections.abc import Sequence

from exporter.config.values import ForecastMode
from exporter.replay.engine import Arm
from exporter.replay.exposition import ExpositionObserver
from exporter.replay.hpa import Hpa
from exporter.replay.policies import OursPolicy
from exporter.replay.settings import ReplaySettings
from exporter.sizing.demand_history import DAY_S
from exporter.sizing.forecast_choice import ForecastStrategy


def arm_name(mode: ForecastMode) -> str:
    """The arm's name in reports: `ours-<forecaster>`."""
    return f"ours-{mode.value}"


def forecast_arms(
    settings: ReplaySettings,
    modes: Sequence[ForecastMode],
    *,
    season_s: float = DAY_S,
    bucket_s: float | None = None,
    history: Sequence[tuple[float, float]] = (),
) -> list[Arm]:
    """One arm per mode, its horizon the replay's startup delay; `history` is (time s, rate
    req/s) of windows read before the replay's start (times before 0), fed to each
    forecaster in order, so its backtest and season start warm."""
    dep = settings.deployment
    arms: list[Arm] = []
    for mode in modes:
        strategy = ForecastStrategy(
            mode, settings.startup_delay_s, season_s=season_s, bucket_s=bucket_s
        )
        for time_s, rate_rps in history:
            strategy.observe(time_s, rate_rps)
        strategy.choices.clear()  # what sized on the replay, not on the history
        policy = OursPolicy(dep, settings.window_s, name=arm_name(mode), forecaster=strategy)
        observer = ExpositionObserver(
            model_name=dep.model_name, kv_capacity_tokens=settings.kv_capacity_tokens,
            deployment=dep.name,
        )  # fmt: skip
        scaler = Hpa(settings.sizer_behavior, dep.min_replicas, dep.max_replicas)
        arms.append(Arm(policy, observer, scaler, settings.initial_replicas))
    return arms
