"""Policies replayed in parallel processes (exporter/replay/parallel.py): how they are split,
a stop asked by the parent, a failure in a process. That the report is the one-process report
is tests/exporter/replay/test_replay_reference.py's."""

from __future__ import annotations

import numpy as np
import pytest

from exporter.replay.arrivals import DrawnArrivals
from exporter.replay.parallel import groups, replay_parallel
from exporter.replay.policies import PolicyName
from exporter.replay.settings import load_settings
from exporter.replay.trace import TraceError
from model.queueing.params import ServiceParams
from model.simulation.workloads import RequestTrace
from tests.conftest import DATA_DIR

TRUTH = ServiceParams(6.68, 0.0201, 5.52e-5)
SETTINGS = load_settings(DATA_DIR / "replay-sample.yaml")


def _arrivals() -> DrawnArrivals:
    rng = np.random.default_rng(4)
    times = np.sort(rng.uniform(0, 900, 2000))
    return DrawnArrivals(RequestTrace(times, rng.integers(100, 3000, times.size),
                                      rng.integers(10, 300, times.size)))


def test_policies_are_dealt_round_robin_into_non_empty_groups() -> None:
    ours, throughput, reactive, fixed = PolicyName.OURS, PolicyName.THROUGHPUT, \
        PolicyName.REACTIVE, PolicyName.FIXED
    assert groups([ours, throughput, reactive, fixed], 2) == [(ours, reactive),
                                                              (throughput, fixed)]
    assert groups([ours, throughput], 8) == [(ours,), (throughput,)]
    assert groups([ours, throughput], 0) == [(ours, throughput)]


def test_a_stop_asked_by_the_parent_ends_every_process_with_a_partial_report() -> None:
    asked = []

    def stop() -> bool:
        asked.append(1)
        return len(asked) >= 3

    seen = []
    result = replay_parallel(SETTINGS, TRUTH, tuple(PolicyName), _arrivals, jobs=2,
                             stop=stop, on_step=lambda step, run: seen.append(step.end_s))
    assert result.partial
    assert result.policies == tuple(p.value for p in PolicyName)
    assert list(result.cards) == list(result.policies)
    # Each card holds the windows stepped: the third answer stops them after the next one.
    assert {card.windows for card in result.cards.values()} == {result.windows} == {4}
    assert seen == [SETTINGS.window_s * k for k in range(1, 5)]


def test_a_failure_in_a_process_is_raised_in_the_parent() -> None:
    def broken() -> DrawnArrivals:
        raise TraceError("trace.csv, row 3: no time")

    with pytest.raises(TraceError, match="row 3"):
        replay_parallel(SETTINGS, TRUTH, tuple(PolicyName), broken, jobs=2)
