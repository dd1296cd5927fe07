"""S6, W1: a pod answering garbage, binary, empty or NaN metrics is a failed pod (counted under
`parse`, warned once, its load kept by the missing-pod guard), and a URL failing the same way
cycle after cycle is one WARNING, then DEBUG lines."""

from __future__ import annotations

import logging
import re

import pytest

from exporter.base.clock import ManualClock
from exporter.base.errors import FailureReason
from exporter.collector.observations import WindowTracker
from exporter.collector.sources import ScrapeSource
from tests.fixtures.vllm_exposition import PodTotals, render, steady_increment
from tests.reliability.fault_server import Fault, FaultServer

pytestmark = pytest.mark.integration  # real HTTP on loopback

T0 = 1_700_000_000.0
W = 30.0
STEP = steady_increment(
    completions=60, in_tokens=512, out_tokens=128, ttft_s=0.05, itl_s=0.01,
    queue_s=0.0, inference_s=1.3, running=3, waiting=0, kv_usage=0.1,
)  # fmt: skip
_VALUE = re.compile(r"^(vllm:\S+) \S+$", re.MULTILINE)

GARBAGE = {
    "garbage": "\x00\xff not an exposition {{{\n" * 50,
    "binary": bytes(range(256)).decode("latin-1") * 20,
    "empty": "",
    "nan": _VALUE.sub(r"\1 NaN", render(PodTotals().plus(STEP, times=3))),
}


class TwoPods:
    """Two pods at the same steady load; the second answers `bad` once `broken` is set."""

    def __init__(self, bad: str) -> None:
        self.windows = 0
        self.broken = False
        self.bad = bad
        self.good = FaultServer(Fault.SERVE, self.good_body)
        self.flaky = FaultServer(Fault.SERVE, self.flaky_body)

    def good_body(self) -> str:
        return render(PodTotals().plus(STEP, times=self.windows + 1))

    def flaky_body(self) -> str:
        return self.bad if self.broken else self.good_body()


@pytest.mark.parametrize("kind", sorted(GARBAGE))
def test_a_pod_answering_garbage_is_a_failed_pod_whose_load_is_kept(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    pods = TwoPods(GARBAGE[kind])
    clock = ManualClock(T0)
    with pods.good, pods.flaky:
        source = ScrapeSource(clock=clock, urls=[pods.good.url, pods.flaky.url], timeout_s=2.0)
        tracker = WindowTracker("d")
        tracker.observe(source.read())
        clock.advance(W)
        pods.windows = 1
        healthy = tracker.observe(source.read())
        assert healthy.observed_pods == 2
        pods.broken = True
        caplog.set_level(logging.DEBUG)
        caplog.clear()
        for window in range(2, 5):
            clock.advance(W)
            pods.windows = window
            read = source.read()
            obs = tracker.observe(read)
            assert [f.reason for f in read.failures] == [FailureReason.PARSE], kind
            assert (obs.observed_pods, obs.unobserved_pods) == (1, 1)
            assert obs.arrival_rate_rps == pytest.approx(healthy.arrival_rate_rps)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "parse" in warnings[0].getMessage()


def test_a_url_failing_the_same_way_warns_once_then_logs_at_debug_and_notes_recovery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock(T0)
    body = render(PodTotals().plus(STEP))
    with FaultServer(Fault.HANG, (body,), max_seconds=5.0) as hanging:
        source = ScrapeSource(clock=clock, urls=[hanging.url], timeout_s=0.3)
        caplog.set_level(logging.DEBUG)
        for _ in range(3):
            assert [f.reason for f in source.read().failures] == [FailureReason.TIMEOUT]
        levels = [r.levelno for r in caplog.records if hanging.url in r.getMessage()]
        assert levels.count(logging.WARNING) == 1 and levels.count(logging.DEBUG) >= 2
        hanging.fault = Fault.SERVE
        caplog.clear()
        source.read()
    assert any(
        r.levelno == logging.INFO and "recovered" in r.getMessage() for r in caplog.records
    ), [r.getMessage() for r in caplog.records]
