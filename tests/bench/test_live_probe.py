"""The live run's targets follow its own light-load probe, and its daemon's first window starts
after the probe's bursts."""

from __future__ import annotations

import pytest

from bench.real_vllm.live_probe import (
    CYCLE_PERIOD_S,
    MAIN,
    PROMETHEUS_SCRAPE_S,
    quiet_wait_s,
    slo_targets,
)
from bench.real_vllm.sweep import ShapeProbe


def light(ttft_ms: float, itl_ms: float) -> ShapeProbe:
    return ShapeProbe(shape=MAIN, single_ttft_ms=ttft_ms, single_tpot_ms=itl_ms,
                      single_itl_ms=itl_ms, single_client_ttft_ms=ttft_ms + 2.0,
                      single_e2e_ms=200.0, saturation_rps=18.0, burst_itl_ms=28.0)  # fmt: skip


def test_targets_scale_with_the_host() -> None:
    assert slo_targets(light(44.3, 2.48)) == pytest.approx((79.7, 11.9))  # the reference run
    fast, slow = slo_targets(light(20.0, 1.0)), slo_targets(light(80.0, 4.0))
    assert slow[0] == pytest.approx(4 * fast[0]) and slow[1] == pytest.approx(4 * fast[1])


def test_the_daemon_waits_until_its_look_back_misses_the_probe() -> None:
    end = 1000.0
    wait = quiet_wait_s(end, now_s=end + 1.0)
    first_window_start = end + 1.0 + wait - CYCLE_PERIOD_S
    assert first_window_start >= end + PROMETHEUS_SCRAPE_S
    assert quiet_wait_s(end, now_s=end + 60.0) == 0.0
