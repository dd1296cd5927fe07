"""Mixed emulator: several variants of one model, each with its own ports, KV capacity and
truth, every exposition readable by the collector."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import numpy as np
import pytest
import requests

from exporter.base.clock import ManualClock
from exporter.collector.vllm_metrics import CounterName, GaugeName, parse_exposition
from exporter.testbed.mixed_emulator import PORTS_PER_VARIANT, MixedEmulatedFleet
from exporter.testbed.variant_truths import ServedModel, truth
from model.calibration.prior import Accelerator
from model.queueing.params import ServerConfig
from model.simulation.mixed import FleetRouting, VariantSpec
from model.simulation.workloads import LengthDist, LengthKind

H100 = truth(ServedModel.LLAMA_8B, Accelerator.H100)
L40S = truth(ServedModel.LLAMA_8B, Accelerator.L40S)
SERVER = ServerConfig(256, 8192)


def specs(delay_s: float = 5.0) -> list[VariantSpec]:
    return [
        VariantSpec(name=name, params=t.params, server=SERVER,
                    kv_capacity_tokens=t.kv_capacity_tokens, startup_delay_s=delay_s)
        for name, t in (("h100", H100), ("l40s", L40S))
    ]  # fmt: skip


def make(clock: ManualClock, **kw: object) -> MixedEmulatedFleet:
    args: dict[str, object] = {
        "rng": np.random.default_rng(7), "arrivals": 8.0, "model_name": "llama",
        "input_lengths": LengthDist(LengthKind.UNIFORM, 512),
        "output_lengths": LengthDist(LengthKind.UNIFORM, 128),
        "replicas": {"h100": 1, "l40s": 2}, "clock": clock,
    }
    args.update(kw)
    return MixedEmulatedFleet(specs(), **args)  # type: ignore[arg-type]


@pytest.fixture
def manual() -> Iterator[tuple[MixedEmulatedFleet, ManualClock]]:
    clock = ManualClock()
    fleet = make(clock)
    fleet.start(background=False)
    yield fleet, clock
    fleet.stop()


def advance(fleet: MixedEmulatedFleet, clock: ManualClock, seconds: int) -> None:
    for _ in range(seconds):
        clock.advance(1.0)
        fleet.sync()


def read(url: str, clock: ManualClock):  # type: ignore[no-untyped-def]
    response = requests.get(url, timeout=5)
    response.raise_for_status()
    return parse_exposition(response.text, pod=url, time_s=clock.time(), model_name="llama")


def test_each_variants_exposition_parses_with_the_collector(manual) -> None:  # type: ignore[no-untyped-def]
    fleet, clock = manual
    advance(fleet, clock, 60)
    urls = fleet.urls_by_variant()
    assert [len(urls["h100"]), len(urls["l40s"])] == [1, 2]
    for variant, t in (("h100", H100), ("l40s", L40S)):
        for url in urls[variant]:
            sample = read(url, clock)
            assert sample.ok, (variant, sample.status)
            assert sample.model_names == ("llama",)
            assert sample.kv_capacity_tokens == pytest.approx(t.kv_capacity_tokens, rel=1e-3)
            assert sample.counters[CounterName.REQUEST_SUCCESS] > 0
            assert GaugeName.KV_USAGE in sample.gauges


def test_least_loaded_sends_the_faster_variant_more_per_replica(manual) -> None:  # type: ignore[no-untyped-def]
    fleet, clock = manual
    advance(fleet, clock, 120)
    urls = fleet.urls_by_variant()
    done = {v: [read(u, clock).counters[CounterName.REQUEST_SUCCESS] for u in urls[v]]
            for v in urls}
    assert min(done["h100"]) > max(done["l40s"])  # H100 serves about 3x an L40S here
    assert sum(done["h100"]) + sum(done["l40s"]) == fleet.result().completed


def test_weighted_follows_the_planned_rates() -> None:
    clock = ManualClock()
    fleet = make(clock, routing=FleetRouting.WEIGHTED, weights={"h100": 1.0, "l40s": 0.0})
    fleet.start(background=False)
    try:
        advance(fleet, clock, 30)
        urls = fleet.urls_by_variant()
        assert all(read(u, clock).counters.get(CounterName.REQUEST_SUCCESS, 0.0) == 0
                   for u in urls["l40s"])
        fleet.set_weights({"l40s": 1.0})
        advance(fleet, clock, 60)
        assert all(read(u, clock).counters[CounterName.REQUEST_SUCCESS] > 0
                   for u in urls["l40s"])
    finally:
        fleet.stop()


def _free_block(size: int) -> int:
    """A base port with `size` free ports above it (checked by binding each)."""
    for _ in range(20):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + size >= 65535:
            continue
        ok = True
        for port in range(base, base + size):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    pytest.fail("no free block of ports")


def test_each_variant_has_its_own_port_range_and_scales_alone() -> None:
    clock = ManualClock()
    base = _free_block(PORTS_PER_VARIANT + 3)
    fleet = make(clock, base_port=base)
    fleet.start(background=False)
    try:
        ports = {v: sorted(int(u.split(":")[2].split("/")[0]) for u in us)
                 for v, us in fleet.urls_by_variant().items()}
        assert ports == {"h100": [base], "l40s": [base + PORTS_PER_VARIANT,
                                                  base + PORTS_PER_VARIANT + 1]}
        fleet.set_variant_replicas("h100", 2)
        advance(fleet, clock, 6)
        fleet.set_variant_replicas("l40s", 1)
        advance(fleet, clock, 60)
        ports = {v: sorted(int(u.split(":")[2].split("/")[0]) for u in us)
                 for v, us in fleet.urls_by_variant().items()}
        assert ports["h100"] == [base, base + 1]
        assert len(ports["l40s"]) == 1 and ports["l40s"][0] >= base + PORTS_PER_VARIANT
        with pytest.raises(ValueError, match="set_variant_replicas"):
            fleet.set_replicas(1)
    finally:
        fleet.stop()
