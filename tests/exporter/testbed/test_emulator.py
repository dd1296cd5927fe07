"""Emulator: vLLM's exposition over real HTTP on 127.0.0.1, counters against the simulator."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from exporter.base.clock import ManualClock
from exporter.testbed.emulator import EmulatedFleet
from model.queueing.params import ServerConfig, ServiceParams
from model.simulation.workloads import LengthDist, LengthKind, RateProfile

LLAMA = ServiceParams(alpha_ms=6.68, beta_ms=2.01e-2, gamma_ms=5.52e-5)
DUMP_MAX_MODEL_LEN = 2048  # the dump's tiny model: token buckets stop at 2000
# collector-spec §4: every vLLM family the collector (or its bonus signals) reads.
NEEDED = {
    "vllm:request_success": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_inference_time_seconds": "histogram",
    "vllm:num_preemptions": "counter",
    "vllm:cache_config_info": "gauge",
    "process_start_time_seconds": "gauge",
}


def families(text: str) -> dict[str, tuple[str, list[tuple[str, dict[str, str], float]]]]:
    return {
        f.name: (f.type, [(s.name, dict(s.labels), s.value) for s in f.samples])
        for f in text_string_to_metric_families(text)
    }


def scrape(url: str) -> dict[str, tuple[str, list[tuple[str, dict[str, str], float]]]]:
    response = requests.get(url, timeout=5)
    response.raise_for_status()
    return families(response.text)


def value(fams: dict, sample: str, **labels: str) -> float:  # type: ignore[type-arg]
    """Sum of the samples named `sample` whose labels include `labels`."""
    family = sample
    for suffix in ("_total", "_sum", "_count"):
        if sample.endswith(suffix) and sample[: -len(suffix)] in fams:
            family = sample[: -len(suffix)]
    return sum(
        v for name, labs, v in fams[family][1]
        if name == sample and all(labs.get(k) == x for k, x in labels.items())
    )


@pytest.fixture
def manual() -> Iterator[tuple[EmulatedFleet, ManualClock]]:
    clock = ManualClock()
    fleet = EmulatedFleet(
        LLAMA,
        ServerConfig(256, 8192),
        rng=np.random.default_rng(42),
        arrivals=6.0,
        input_lengths=LengthDist(LengthKind.UNIFORM, 512),
        output_lengths=LengthDist(LengthKind.UNIFORM, 256),
        model_name="tiny",
        replicas=2,
        clock=clock,
        max_model_len=DUMP_MAX_MODEL_LEN,
        startup_delay_s=5.0,
    )
    fleet.start(background=False)
    yield fleet, clock
    fleet.stop()


def advance(fleet: EmulatedFleet, clock: ManualClock, seconds: float) -> None:
    for _ in range(int(seconds)):
        clock.advance(1.0)
        fleet.sync()


def test_exposition_matches_the_real_vllm_dump(manual, vllm_metrics_text: str) -> None:  # type: ignore[no-untyped-def]
    fleet, clock = manual
    advance(fleet, clock, 20)
    ours = scrape(fleet.urls[0])
    real = {k: v for k, v in families(vllm_metrics_text).items() if k.startswith("vllm:")}
    assert set(ours) == set(real) | {"process_start_time_seconds"}
    for name, (typ, samples) in real.items():
        our_typ, our_samples = ours[name]
        assert our_typ == typ, name

        def shape(rows: list) -> set[tuple[str, tuple[str, ...]]]:  # type: ignore[type-arg]
            return {(s, tuple(sorted(k for k in labs if k != "le"))) for s, labs, _ in rows}

        assert shape(our_samples) == shape(samples), name
        real_le = [labs["le"] for s, labs, _ in samples if "le" in labs]
        assert [labs["le"] for s, labs, _ in our_samples if "le" in labs] == real_le, name
        if name != "vllm:cache_config_info":
            real_vals = {tuple(sorted(labs.items())) for _, labs, _ in samples}
            real_vals = {tuple((k, v) for k, v in labs if k != "model_name") for labs in real_vals}
            our_vals = {
                tuple((k, v) for k, v in sorted(labs.items()) if k != "model_name")
                for _, labs, _ in our_samples
            }
            assert our_vals == real_vals, name  # same label values (engine, reasons, le, ...)
    for name, typ in NEEDED.items():
        assert ours[name][0] == typ
    assert all(labs.get("model_name") == "tiny" for _, labs, _ in ours["vllm:prompt_tokens"][1])


def test_counter_deltas_agree_with_the_simulator(manual) -> None:  # type: ignore[no-untyped-def]
    fleet, clock = manual
    advance(fleet, clock, 30)
    t1 = fleet.sim_time_s
    before = [scrape(u) for u in fleet.urls]
    advance(fleet, clock, 40)
    t2 = fleet.sim_time_s
    after = [scrape(u) for u in fleet.urls]

    def delta(sample: str, **labels: str) -> float:
        return sum(value(a, sample, **labels) - value(b, sample, **labels)
                   for a, b in zip(after, before, strict=True))

    res = fleet.result()
    done = res.finished_between(t1, t2)
    firsts = (res.first_token_s > t1) & (res.first_token_s <= t2)
    truth = fleet.truth(t1, t2)
    assert truth.completed > 150
    assert delta("vllm:request_success_total", finished_reason="length") == truth.completed
    assert delta("vllm:request_success_total") == truth.completed
    assert delta("vllm:prompt_tokens_total") == res.input_tokens[firsts].sum()
    assert delta("vllm:request_prompt_tokens_sum") == res.input_tokens[done].sum()
    assert delta("vllm:request_generation_tokens_sum") == res.output_tokens[done].sum()
    assert delta("vllm:time_to_first_token_seconds_count") == np.count_nonzero(firsts)
    ttft_s = delta("vllm:time_to_first_token_seconds_sum") / np.count_nonzero(firsts)
    assert ttft_s * 1000 == pytest.approx(truth.mean_ttft_ms, rel=1e-9)
    tpot_s = delta("vllm:request_time_per_output_token_seconds_sum") / truth.completed
    assert tpot_s * 1000 == pytest.approx(truth.mean_itl_ms, rel=1e-9)
    assert delta("vllm:e2e_request_latency_seconds_sum") * 1000 == pytest.approx(
        np.sum(res.e2e_ms[done]), rel=1e-9)
    running = sum(value(a, "vllm:num_requests_running") for a in after)
    assert running == sum(s.running for s in fleet.replica_status())


def test_everything_adds_up_once_the_load_stops(manual) -> None:  # type: ignore[no-untyped-def]
    fleet, clock = manual
    advance(fleet, clock, 20)
    fleet.set_rate_rps(0.0)
    advance(fleet, clock, 30)
    res = fleet.result()
    assert res.in_system == 0 and res.completed == res.arrived > 50
    scrapes = [scrape(u) for u in fleet.urls]
    total = sum(value(s, "vllm:generation_tokens_total") for s in scrapes)
    assert total == res.output_tokens.sum()
    itl_count = sum(value(s, "vllm:inter_token_latency_seconds_count") for s in scrapes)
    assert itl_count == (res.output_tokens - 1).sum()
    assert sum(value(s, "vllm:num_requests_running") for s in scrapes) == 0
    assert sum(value(s, "vllm:kv_cache_usage_perc") for s in scrapes) == 0


def test_replicas_come_up_after_the_delay_and_drain_away(manual) -> None:  # type: ignore[no-untyped-def]
    fleet, clock = manual
    advance(fleet, clock, 2)
    fleet.set_replicas(3)
    assert len(fleet.urls) == 2
    advance(fleet, clock, 6)
    assert len(fleet.urls) == 3
    third = fleet.urls[2]
    assert value(scrape(third), "process_start_time_seconds") > clock.time() - 10
    fleet.set_replicas(1)
    advance(fleet, clock, 30)
    assert len(fleet.urls) == 1
    with pytest.raises(requests.ConnectionError):
        requests.get(third, timeout=2)


def test_kv_gauges_and_cache_config_describe_the_capacity(manual) -> None:  # type: ignore[no-untyped-def]
    fleet, clock = manual
    advance(fleet, clock, 20)
    fams = scrape(fleet.urls[0])
    (_, labels, _), = fams["vllm:cache_config_info"][1]
    assert int(labels["num_gpu_blocks"]) * int(labels["block_size"]) == 449_200
    status = fleet.replica_status()[0]
    assert value(fams, "vllm:kv_cache_usage_perc") == pytest.approx(status.kv_tokens / 449_200)
    assert value(fams, "vllm:num_requests_waiting") == status.waiting


def test_same_seed_same_counters() -> None:
    totals = []
    for _ in range(2):
        clock = ManualClock()
        fleet = EmulatedFleet(LLAMA, rng=np.random.default_rng(9), arrivals=8.0, clock=clock,
                              replicas=2)
        fleet.start(background=False)
        advance(fleet, clock, 15)
        totals.append([value(scrape(u), "vllm:generation_tokens_total") for u in fleet.urls])
        fleet.stop()
    assert totals[0] == totals[1] and sum(totals[0]) > 0


def test_profile_drives_the_arrival_rate(manual) -> None:  # type: ignore[no-untyped-def]
    fleet, clock = manual
    fleet.set_profile(RateProfile.constant(20.0))
    advance(fleet, clock, 30)
    assert fleet.truth(0.0, 30.0).arrival_rate_rps == pytest.approx(20.0, rel=0.15)


def test_background_thread_runs_in_compressed_time_and_counts_late_ticks() -> None:
    fleet = EmulatedFleet(
        LLAMA, rng=np.random.default_rng(1), arrivals=10.0, time_scale=40.0, tick_s=1e-4,
        input_lengths=LengthDist(LengthKind.UNIFORM, 256),
        output_lengths=LengthDist(LengthKind.UNIFORM, 64),
    )
    with fleet:
        deadline = time.monotonic() + 0.6
        seen = 0.0
        while time.monotonic() < deadline:  # scrapes race the simulation thread
            seen = value(scrape(fleet.urls[0]), "vllm:request_success_total")
        stats = fleet.stats()
    assert fleet.error is None
    assert stats.sim_time_s > 20.0
    assert stats.ticks > 0 and stats.behind_ticks > 0  # a 0.1 ms period cannot be kept
    assert seen > 0
    assert fleet.urls == []


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [({"time_scale": 0.0}, r"`time_scale`.*got 0"), ({"tick_s": -1.0}, r"`tick_s`.*got -1")],
)
def test_bad_arguments_name_the_field(kwargs: dict[str, float], pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        EmulatedFleet(LLAMA, rng=np.random.default_rng(0), **kwargs)  # type: ignore[arg-type]
