"""Scoring on the truth (percentile bins, means) and the `replay:` config section."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from exporter.base.errors import ConfigError
from exporter.config.values import SloConfig
from exporter.replay.hpa import Behavior
from exporter.replay.policies import ReactiveMetric
from exporter.replay.scoring import Target, Trailing, targets_of
from exporter.replay.settings import load_settings
from model import LatencyMetric, PercentileTarget
from tests.conftest import DATA_DIR


def test_trailing_percentile_is_never_below_the_exact_one_and_within_one_percent() -> None:
    rng = np.random.default_rng(1)
    trailing = Trailing(windows=3)
    parts = [rng.lognormal(3.0, 1.0, 2000) for _ in range(5)]
    for part in parts:
        trailing.add(part, np.ones_like(part))
    exact = np.sort(np.concatenate(parts[-3:]))  # only the last three windows count
    for q in (0.5, 0.95, 0.99):
        value = exact[int(np.ceil(q * exact.size)) - 1]
        got = trailing.quantile_ms(q)
        assert got is not None and value <= got <= value * 1.0101


def test_trailing_weights_count_tokens_and_empty_is_none() -> None:
    trailing = Trailing(windows=1)
    assert trailing.quantile_ms(0.5) is None
    trailing.add(np.array([10.0, 100.0]), np.array([9.0, 1.0]))
    assert trailing.quantile_ms(0.9) == pytest.approx(10.0, rel=0.011)
    assert trailing.quantile_ms(0.95) == pytest.approx(100.0, rel=0.011)


def test_targets_are_the_means_then_the_percentiles() -> None:
    slo = SloConfig(ttft_ms=50.0, itl_ms=20.0, percentiles=(
        PercentileTarget(LatencyMetric.TTFT, 0.95, 300.0),
        PercentileTarget(LatencyMetric.ITL_PER_TOKEN, 0.99, 80.0)))
    assert [t.key for t in targets_of(slo)] == [
        "ttft_mean", "itl_mean", "ttft_p95", "itl_per_token_p99"]
    assert Target(LatencyMetric.ITL_PER_REQUEST, 0.999, 1.0).key == "itl_per_request_p99.9"


def test_sample_settings_and_defaults() -> None:
    s = load_settings(DATA_DIR / "replay-sample.yaml")
    assert s.deployment.name == "llama-8b-vllm" and s.window_s == 30.0
    assert s.truth is not None and s.truth.alpha_ms == 6.68
    assert (s.fixed_replicas, s.initial_replicas, s.startup_delay_s) == (3, 1, 90.0)
    assert s.reactive_metric is ReactiveMetric.WAITING and s.reactive_threshold == 5.0
    assert s.sizer_behavior.scale_up.tolerance == 0.0
    assert s.reactive_behavior == Behavior.kubernetes_default()


def test_every_bad_replay_key_is_named(tmp_path: Path) -> None:
    config = yaml.safe_load((DATA_DIR / "replay-sample.yaml").read_text())
    config["replay"].update(startup_delay_s=-1, fixed_replicas=0, colour="blue",
                            reactive={"metric": "queue"}, hpa={"reactive": {"tolerance": 2}})
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    text = "\n".join(caught.value.problems)
    for key in ("replay.startup_delay_s", "replay.fixed_replicas", "replay.colour",
                "replay.reactive.metric", "replay.hpa.reactive.tolerance"):
        assert key in text


def test_a_config_with_two_deployments_needs_one_named(tmp_path: Path) -> None:
    config = yaml.safe_load((DATA_DIR / "replay-sample.yaml").read_text())
    second = dict(config["deployments"][0], name="other")
    config["deployments"].append(second)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError, match="choose one with --deployment"):
        load_settings(path)
    assert load_settings(path, "other").deployment.name == "other"
