"""The growing-backlog sign is relative to the window's requests: a light window whose backlog
moved by a request or two is not saturated; a backlog holding a real share of the window's
arrivals is."""

from __future__ import annotations

import pytest

from exporter.collector.pod_observation import observe_pod
from exporter.collector.saturation import Saturation, backlog_growing
from exporter.collector.vllm_metrics import parse_exposition
from tests.fixtures.vllm_exposition import PodTotals, render, steady_increment

T0 = 1_700_000_000.0
W = 20.0


def window(completions: int, running_start: int, running_end: int, waiting_end: int = 0):  # type: ignore[no-untyped-def]
    start = PodTotals(success=50, running=running_start, waiting=0)
    end = start.plus(
        steady_increment(completions=completions, in_tokens=1536, out_tokens=256, ttft_s=0.25,
                         itl_s=0.036, queue_s=0.0, inference_s=9.0, running=running_end,
                         waiting=waiting_end, kv_usage=0.4)
    )  # fmt: skip
    return observe_pod(
        parse_exposition(render(start), pod="a", time_s=T0),
        parse_exposition(render(end), pod="a", time_s=T0 + W),
    )


def test_a_light_window_whose_backlog_rose_by_two_is_not_saturated() -> None:
    # 10 completions in 20 s (0.5 req/s), 4 running at the start and 6 at the end: Poisson noise.
    pod = window(completions=10, running_start=4, running_end=6)
    assert pod.backlog_change == 2
    assert not pod.queue_growing
    assert Saturation.BACKLOG_GROWING not in pod.saturation


def test_a_backlog_holding_a_share_of_the_window_is_growing() -> None:
    pod = window(completions=40, running_start=4, running_end=10, waiting_end=4)  # +10 of 50
    assert pod.queue_growing and Saturation.BACKLOG_GROWING in pod.saturation


@pytest.mark.parametrize(
    ("change", "requests", "growing"),
    [
        (None, 10.0, False),
        (2.0, 12.0, False),  # the floor: a change of two is never enough
        (3.0, 13.0, True),
        (10.0, 110.0, False),  # 10 of 110: under a tenth
        (12.0, 112.0, True),
        (-5.0, 0.0, False),
    ],
)
def test_backlog_growing(change: float | None, requests: float, growing: bool) -> None:
    assert backlog_growing(change, requests) is growing
