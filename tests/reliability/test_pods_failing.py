"""S8, S9: every pod of a deployment failing to answer, and a pod answering again after a run
of errors: neither is read as a deployment without pods, nor as a load that halved."""

from __future__ import annotations

import pytest

from exporter.base.errors import FailureReason
from exporter.collector.observations import ObservationStatus, WindowTracker
from exporter.collector.sources import PodFailure, SourceRead
from exporter.collector.vllm_metrics import parse_exposition
from exporter.sizing.recommender import Reason, Recommender
from tests.exporter.sizing.test_recommender import LLAMA, SHAPE, deployment
from tests.fixtures.vllm_exposition import PodTotals, render, steady_increment

T0 = 1_700_000_000.0
W = 5.0
STEP = steady_increment(
    completions=44, in_tokens=512, out_tokens=128, ttft_s=0.05, itl_s=0.01,
    queue_s=0.0, inference_s=1.3, running=3, waiting=0, kv_usage=0.1,
)  # fmt: skip
PODS = ("10.0.0.1:8000", "10.0.0.2:8000")


def read(k: int, failing: frozenset[str] = frozenset()) -> SourceRead:
    """Window k's end read of two pods at the same steady load; `failing` answer HTTP 500."""
    time_s = T0 + k * W
    text = render(PodTotals().plus(STEP, times=k + 1))
    return SourceRead(
        time_s=time_s,
        samples=tuple(parse_exposition(text, pod=p, time_s=time_s) for p in PODS
                      if p not in failing),
        failures=tuple(PodFailure(p, FailureReason.HTTP_STATUS, "HTTP 500") for p in PODS
                       if p in failing),
    )  # fmt: skip


def test_a_pod_answering_again_after_errors_keeps_the_deployments_load() -> None:
    """S9: the recovering pod's first window was no window, and not counted either: the
    deployment's rate read as the other pod's alone (9.2 req/s of 17.6)."""
    tracker = WindowTracker("d")
    tracker.observe(read(0))
    full = tracker.observe(read(1)).arrival_rate_rps
    assert full == pytest.approx(2 * STEP.success / W)
    rates = []
    for k in range(2, 12):
        failing = frozenset({PODS[1]}) if 2 <= k <= 6 else frozenset()  # 25 s of 500s
        rates.append(tracker.observe(read(k, failing)).arrival_rate_rps)
    assert rates == pytest.approx([full] * len(rates)), rates


def test_every_pod_failing_holds_with_the_known_pods_as_the_current_count() -> None:
    """S8: every pod timing out read as `no_pods`, with no current count (`replicas=-->1`)."""
    rec = Recommender(deployment())
    tracker = WindowTracker("llama")
    tracker.observe(read(0))
    now = T0 + W
    first = rec.decide(now, tracker.observe(read(1)), LLAMA, SHAPE)
    assert first.desired_replicas is not None
    dead = tracker.observe(read(2, frozenset(PODS)))
    assert dead.status is ObservationStatus.NO_PODS and dead.ready_pods == 2
    decision = rec.decide(now + W, dead, LLAMA, SHAPE)
    assert decision.reason is Reason.SOURCE_DOWN
    assert (decision.current_replicas, decision.desired_replicas) == (2, first.desired_replicas)


def test_a_window_whose_count_the_gauges_cannot_hold_is_not_read_as_load() -> None:
    """P3's second guard: counters that jump by 1e15 in one window (a duplicating source, a
    corrupted pod) are no load: 3 requests running at either end cannot have finished 1e15
    requests of 1.3 s in 5 s. The pod is unobserved, its load estimated from the other's."""
    start = read(1)
    time_s = start.time_s + W
    jumped = render(PodTotals().plus(STEP, times=2e13))
    normal = render(PodTotals().plus(STEP, times=3))
    end = SourceRead(time_s=time_s, samples=(
        parse_exposition(normal, pod=PODS[0], time_s=time_s),
        parse_exposition(jumped, pod=PODS[1], time_s=time_s),
    ))  # fmt: skip
    tracker = WindowTracker("d")
    tracker.observe(start)
    obs = tracker.observe(end)
    assert (obs.observed_pods, obs.unobserved_pods) == (1, 1)
    assert obs.arrival_rate_rps == pytest.approx(2 * STEP.success / W)
