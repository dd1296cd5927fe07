"""The forecasters' history: downsampled into buckets, kept for two seasons, and restored
after a restart from what the state file saved."""

from __future__ import annotations

import json
import math

from exporter.config.values import DeploymentConfig, ForecastMode, SloConfig, SourceConfig
from exporter.daemon.deployment_state import restore_state, saved_state
from exporter.sizing.cycle import DeploymentCycle
from exporter.sizing.demand_history import DemandHistory
from exporter.sizing.forecast_choice import ForecastStrategy
from exporter.sizing.forecasters import ForecasterName, holt_winters
from model import ServerConfig

DEPLOYMENT = DeploymentConfig(
    name="llama", model_name="llama", source=SourceConfig(scrape_urls=("http://127.0.0.1:1/",)),
    server=ServerConfig(), slo=SloConfig(ttft_ms=60.0, itl_ms=20.0), look_ahead_s=300.0,
    forecaster=ForecastMode.AUTO,
)  # fmt: skip
CLOCK_S = 1_700_000_000.0
SEASON_S = 3600.0


def _daily(t: float) -> float:
    return 20.0 - 15.0 * math.cos(2 * math.pi * t / SEASON_S)


def _fed(history: DemandHistory, until_s: float) -> None:
    t = CLOCK_S - until_s
    while t <= CLOCK_S:
        history.add(t, _daily(t))
        t += 30.0


def test_buckets_hold_the_mean_rate_and_the_kept_seasons() -> None:
    history = DemandHistory(season_s=SEASON_S, bucket_s=60.0)
    _fed(history, 5 * SEASON_S)
    series = history.series()
    assert len(series.buckets) == history.kept_buckets - 1  # the one being filled aside
    assert len(series.recent) == 40
    first = series.start_s
    fed = [CLOCK_S - 5 * SEASON_S + 30.0 * k for k in range(int(5 * SEASON_S / 30) + 1)]
    inside = [_daily(t) for t in fed if first <= t < first + 60.0]
    assert len(inside) == 2
    assert series.buckets[0] == sum(inside) / 2


def test_history_survives_a_restart() -> None:
    before = DeploymentCycle(DEPLOYMENT)
    before.forecaster = ForecastStrategy(ForecastMode.AUTO, 300.0, season_s=SEASON_S,
                                         bucket_s=60.0)  # fmt: skip
    _fed(before.forecaster.history, 2.5 * SEASON_S)
    saved = json.loads(json.dumps(saved_state({"llama": before}), allow_nan=False))
    after = DeploymentCycle(DEPLOYMENT)
    after.forecaster = ForecastStrategy(ForecastMode.AUTO, 300.0, season_s=SEASON_S,
                                        bucket_s=60.0)  # fmt: skip
    assert restore_state(saved, {"llama": after}, CLOCK_S + 30.0) == []
    assert after.forecaster.history.series() == before.forecaster.history.series()
    # The restored day is enough for the seasonal forecaster at once.
    assert holt_winters(after.forecaster.history.series(), 300.0) is not None


def test_a_restore_drops_what_does_not_parse_is_in_the_future_or_too_old() -> None:
    history = DemandHistory(season_s=SEASON_S, bucket_s=60.0)
    now_bucket = math.floor(CLOCK_S / 60.0)
    saved = {
        "bucket_s": 60.0,
        "buckets": [[now_bucket - 3, 30.0, 2], [now_bucket + 5, 30.0, 2],  # kept, future
                    [now_bucket - 10_000, 30.0, 2], [now_bucket - 2, math.inf, 2],  # old, inf
                    [now_bucket - 1, 10**400, 2], ["x", 1.0, 1], [now_bucket - 4, -1.0, 1],
                    [now_bucket - 5, 1e300, 1]],
        "recent": [[CLOCK_S - 60.0, 12.0], [CLOCK_S + 60.0, 12.0], [CLOCK_S - 30.0, -1.0],
                   [CLOCK_S - 20.0, True]],
    }  # fmt: skip
    history.restore(json.loads(json.dumps(saved).replace("Infinity", "1e999")), CLOCK_S)
    assert history.to_dict()["buckets"] == [[now_bucket - 3, 30.0, 2]]
    assert list(history.recent) == [(CLOCK_S - 60.0, 12.0)]


def test_another_bucket_size_drops_the_buckets() -> None:
    old = DemandHistory(season_s=SEASON_S, bucket_s=60.0)
    _fed(old, SEASON_S)
    new = DemandHistory(season_s=SEASON_S, bucket_s=120.0)
    new.restore(old.to_dict(), CLOCK_S)
    assert new.series().buckets == () and len(new.recent) == 40
    assert ForecasterName.HOLT_WINTERS.value == "holt_winters"
