"""The live run's targets follow its own light-load probe, and its daemon's first window starts
after the probe's bursts."""

from __future__ import annotations

import json

import pytest

from bench.real_vllm import live_report
from bench.real_vllm.live_probe import (
    CYCLE_PERIOD_S,
    MAIN,
    PROMETHEUS_SCRAPE_S,
    SLO_ITL_FACTOR,
    SLO_TTFT_FACTOR,
    quiet_wait_s,
    slo_targets,
)
from bench.real_vllm.sweep import Shape, ShapeProbe

LIVE_JSON = live_report.RESULTS_DIR / f"{live_report.STEM}.json"


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


def test_the_live_report_says_its_targets_come_from_its_probe() -> None:
    """The committed live run's targets are its own probe's multiples, and its report says so
    with the probe's figures (not the fixed targets of an older run)."""
    doc = json.loads(LIVE_JSON.read_text())
    main = f"{MAIN.input_tokens}/{MAIN.output_tokens}"
    found = doc["probes"][main]
    probed = ShapeProbe(**{**found, "shape": Shape(**found["shape"])})
    slo = doc["meta"]["daemon_config"]["deployments"][0]["slo"]
    assert (slo["ttft_ms"], slo["itl_ms"]) == pytest.approx(slo_targets(probed))
    text = live_report.markdown(doc)
    assert f"{SLO_TTFT_FACTOR:g}x the TTFT and {SLO_ITL_FACTOR:g}x the ITL of single {main}" in text
    assert f"({probed.single_ttft_ms:.1f} ms, {probed.single_itl_ms:.2f} ms)" in text
    assert "Chosen from the sweep" not in text
