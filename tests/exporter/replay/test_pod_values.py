"""A simulated pod read as values is the sample the collector parses from its exposition text,
value for value (issue 45: the text round trip was a third of a replay's time)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from exporter.replay.arrivals import DrawnArrivals
from exporter.replay.engine import Engine
from exporter.replay.exposition import ExpositionObserver
from exporter.replay.pod_values import pod_values
from exporter.replay.policies import PolicyName
from exporter.replay.session import build_arm, fleet_settings
from exporter.replay.settings import load_settings
from exporter.testbed.emulator_metrics import ReplicaMetrics
from model.queueing.params import ServiceParams
from model.simulation.workloads import RequestTrace
from tests.conftest import DATA_DIR

TRUTH = ServiceParams(6.68, 0.0201, 5.52e-5)


def _trace(seed: int = 5) -> RequestTrace:
    """Ten minutes of a load that rises past two replicas' worth and falls back."""
    rng = np.random.default_rng(seed)
    times = np.sort(np.concatenate([rng.uniform(0, 600, 1500), rng.uniform(200, 400, 2500)]))
    return RequestTrace(times, rng.integers(100, 6000, times.size),
                        rng.integers(1, 600, times.size))


def test_every_read_of_a_replay_as_values_equals_its_text() -> None:
    settings = load_settings(DATA_DIR / "replay-sample.yaml")
    dep = settings.deployment
    observers = []
    arms = []
    for name in PolicyName:
        observer = ExpositionObserver(model_name=dep.model_name,
                                      kv_capacity_tokens=settings.kv_capacity_tokens,
                                      deployment=dep.name, text_every=1)
        observers.append(observer)
        arms.append(replace(build_arm(settings, name), observer=observer))
    engine = Engine(fleet_settings(settings, TRUTH), arms)
    peak = 0
    for step in engine.steps(DrawnArrivals(_trace())):
        peak = max(peak, *(w.view.observation.ready_pods for w in step.arms))
    # Each read was compared inside the observer (a difference raises): many of them, over
    # fleets that scaled.
    assert sum(o._reads for o in observers) > 200
    assert peak >= 3


@pytest.mark.parametrize("created_s", [0.0, 1234.5])
def test_a_fresh_pod_reads_the_same_as_values_and_as_text(created_s: float) -> None:
    observer = ExpositionObserver(model_name="m", kv_capacity_tokens=100_000)
    replica = observer._replica(0, created_s)
    metrics = replica.metrics
    metrics.set_gauges(running=3, waiting=7, kv_usage_ratio=0.123456789)
    metrics.add_rejections(2)
    text = observer._read_text(0, replica, 60.0)
    values = pod_values(metrics, pod="replica-0", time_s=60.0, model_name="m")
    assert values == text
    assert values is not None and values.process_start_s == (created_s or None)


def test_a_value_the_parser_rejects_is_read_through_the_text() -> None:
    observer = ExpositionObserver(model_name="m", kv_capacity_tokens=100_000, text_every=None)
    replica = observer._replica(0, 10.0)
    metrics = replica.metrics
    metrics.set_gauges(running=1, waiting=0, kv_usage_ratio=float("nan"))
    assert pod_values(metrics, pod="p", time_s=1.0, model_name="m") is None
    sample = observer._read(0, replica, 20.0)
    assert sample == observer._read_text(0, replica, 20.0)


def test_values_that_differ_from_the_text_stop_the_replay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import exporter.replay.exposition as exposition

    def off_by_one(metrics: ReplicaMetrics, **kw: object) -> object:
        sample = pod_values(metrics, **kw)  # type: ignore[arg-type]
        assert sample is not None
        return replace(sample, time_s=sample.time_s + 1)

    monkeypatch.setattr(exposition, "pod_values", off_by_one)
    observer = ExpositionObserver(model_name="m", kv_capacity_tokens=100_000, text_every=3)
    replica = observer._replica(0, 10.0)
    with pytest.raises(RuntimeError, match="exposition text"):
        observer._read(0, replica, 20.0)  # the first read is checked
    observer._read(0, replica, 30.0)  # the next two are not
    observer._read(0, replica, 40.0)
    with pytest.raises(RuntimeError, match="exposition text"):
        observer._read(0, replica, 50.0)
