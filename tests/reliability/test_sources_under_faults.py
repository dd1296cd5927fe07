"""Slow, flooding, redirecting and lying sources: every read ends by its deadline, is counted
under its reason, and never inflates, drops or freezes a recommendation."""

from __future__ import annotations

import random
import time
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from exporter.base.clock import ManualClock
from exporter.base.errors import FailureReason
from exporter.collector.arrival_sampler import ArrivalSampler
from exporter.collector.from_config import build_sources
from exporter.collector.observations import DeploymentObservation, WindowTracker
from exporter.collector.pod_observation import Problem
from exporter.collector.promapi import PrometheusClient
from exporter.collector.sources import ScrapeSource, SourceRead
from exporter.collector.vllm_metrics import parse_exposition
from exporter.config.values import MIB, Config, DeploymentConfig, SloConfig, SourceConfig
from exporter.daemon.daemon import Daemon
from exporter.daemon.statefile import StateFile
from exporter.sizing.reasons import Reason
from model import ServerConfig, ServiceParams
from tests.fixtures.memory import peak_traced_mib
from tests.fixtures.vllm_exposition import PodTotals, render, steady_increment
from tests.reliability.fault_server import Fault, FaultServer

pytestmark = pytest.mark.integration  # real HTTP on loopback

LLAMA = ServiceParams(6.68, 2.01e-2, 5.52e-5)
T0 = 1_700_000_000.0
W = 30.0
STEP = steady_increment(
    completions=60, in_tokens=512, out_tokens=128, ttft_s=0.05, itl_s=0.01,
    queue_s=0.0, inference_s=1.3, running=3, waiting=0, kv_usage=0.1,
)  # fmt: skip


OVERLOADED = steady_increment(
    completions=60, in_tokens=512, out_tokens=128, ttft_s=0.08, itl_s=0.01,
    queue_s=0.0, inference_s=1.3, running=3, waiting=0, kv_usage=0.1,
)  # fmt: skip


def scrape(url: str, timeout_s: float = 1.0, max_body_bytes: int = 1 << 20) -> SourceRead:
    source = ScrapeSource(
        clock=ManualClock(T0), urls=[url], timeout_s=timeout_s, max_body_bytes=max_body_bytes
    )
    return source.read()


def test_a_cycle_read_of_an_endless_body_holds_no_more_than_a_read_buffer() -> None:
    """The cycle's reader threads live as long as the daemon: a whole 32 MiB body read on one
    kept about 23 MB of its malloc arena for good (the soak's RSS step after warm-up)."""
    with FaultServer(Fault.HUGE, max_seconds=30.0) as server:
        read, peak_mib = peak_traced_mib(
            lambda: scrape(server.url, timeout_s=20.0, max_body_bytes=32 * MIB)
        )
    assert [f.reason for f in read.failures] == [FailureReason.BODY_TOO_LARGE]
    assert peak_mib < 1, peak_mib


def test_a_cycle_read_keeps_every_line_the_reader_parses() -> None:
    """Filtered to vLLM's lines and the process start, the read is the same as the whole text's."""
    text = render(PodTotals()) + "process_start_time_seconds 1.7e9\n" + "# other\nfoo 1\n" * 500
    with FaultServer(Fault.SERVE, [text]) as server:
        read = scrape(server.url)
    assert read.samples == (parse_exposition(text, pod=read.samples[0].pod, time_s=T0),)


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        (Fault.DRIP, FailureReason.TIMEOUT),
        (Fault.HANG, FailureReason.TIMEOUT),
        (Fault.HUGE, FailureReason.BODY_TOO_LARGE),
        (Fault.REDIRECT, FailureReason.HTTP_STATUS),
    ],
)
def test_a_faulty_pod_is_cut_off_by_its_deadline(fault: Fault, reason: FailureReason) -> None:
    with FaultServer(fault) as server, FaultServer(Fault.SERVE, [render(PodTotals())]) as target:
        server.redirect_to = target.url
        start = time.monotonic()
        read = scrape(server.url)
        elapsed = time.monotonic() - start
        assert [f.reason for f in read.failures] == [reason]
        assert not read.samples
        assert elapsed < 2.0, f"{fault}: {elapsed:.1f} s against a 1 s deadline"
        assert target.requests == 0  # a redirect is never followed


def test_a_dripping_prometheus_is_cut_off_by_its_deadline() -> None:
    with FaultServer(Fault.DRIP) as server:
        client = PrometheusClient(server.url.removesuffix("/metrics"), timeout_s=1.0)
        start = time.monotonic()
        with pytest.raises(Exception) as info:
            client.query("up")
        assert getattr(info.value, "reason", None) is FailureReason.TIMEOUT
        assert time.monotonic() - start < 2.0


def deployment(name: str, url: str, **changes: object) -> DeploymentConfig:
    dep = DeploymentConfig(
        name=name, model_name="m", source=SourceConfig(scrape_urls=(url,), scrape_timeout_s=1.0),
        server=ServerConfig(), slo=SloConfig(ttft_ms=60.0, itl_ms=20.0), initial_params=LLAMA,
        min_replicas=1, max_replicas=10,
    )  # fmt: skip
    return replace(dep, **changes)  # type: ignore[arg-type]


def sources(config: Config, clock: ManualClock) -> dict[str, ScrapeSource]:
    return {
        d.name: ScrapeSource(clock=clock, urls=d.source.scrape_urls, model_name="m", timeout_s=1.0)
        for d in config.deployments
    }


def test_one_dripping_pod_does_not_hold_up_another_deployment() -> None:
    state = {"totals": PodTotals()}
    with (
        FaultServer(Fault.SERVE, lambda: render(state["totals"])) as healthy,
        FaultServer(Fault.DRIP, drip_interval_s=0.1) as drip,
    ):
        config = Config(
            cycle_period_s=5.0,
            deployments=(deployment("good", healthy.url), deployment("slow", drip.url)),
        )
        clock = ManualClock(T0)
        daemon = Daemon(config, sources(config, clock), CollectorRegistry(), clock)
        desired = []
        for _ in range(4):
            clock.advance(W)
            state["totals"] = state["totals"].plus(STEP)
            start = time.monotonic()
            snapshot = daemon.run_cycle()
            assert time.monotonic() - start < 2.5  # the slow pod's 1 s deadline, not its drip
            good = next(s for s in snapshot.deployments if s.deployment == "good")
            desired.append(good.decision.desired_replicas)
            slow = next(s for s in snapshot.deployments if s.deployment == "slow")
            assert not slow.source_up
        assert all(d is not None for d in desired[1:]), desired
        daemon.close()


def test_many_hanging_sources_do_not_hold_up_a_healthy_one() -> None:
    """More hanging deployments than any fixed pool of reader threads, each with a deadline
    near the period: the healthy deployment, listed last, is still read within the cycle."""
    with (
        FaultServer(Fault.SERVE, [render(PodTotals())]) as healthy,
        FaultServer(Fault.HANG, max_seconds=10.0) as hang,
    ):
        slow = tuple(
            deployment(f"hang-{k}", hang.url, source=SourceConfig(
                scrape_urls=(hang.url,), scrape_timeout_s=3.5))
            for k in range(20)
        )  # fmt: skip
        config = Config(cycle_period_s=4.0, deployments=(*slow, deployment("good", healthy.url)))
        clock = ManualClock(T0)
        daemon = Daemon(config, build_sources(config, clock), CollectorRegistry(), clock)
        start = time.monotonic()
        snapshot = daemon.run_cycle()
        elapsed = time.monotonic() - start
        daemon.close()
    good = next(s for s in snapshot.deployments if s.deployment == "good")
    assert good.source_up, "the healthy deployment's read waited behind the hanging ones"
    assert elapsed < 4.0


def exposition(totals: PodTotals, started_s: float) -> str:
    return render(replace(totals, process_start_s=started_s))


def observe_sequence(bodies: list[str]) -> list[DeploymentObservation]:
    """Each window's observation of one pod URL answering `bodies` in turn, W apart."""
    answers = iter(bodies)
    clock = ManualClock(T0)
    tracker = WindowTracker("d")
    observations = []
    with FaultServer(Fault.SERVE, lambda: next(answers)) as server:
        source = ScrapeSource(clock=clock, urls=[server.url])
        for _ in bodies:
            observations.append(tracker.observe(source.read()))
            clock.advance(W)
    return observations[1:]


def read_sequence(bodies: list[str]) -> list[float]:
    """The arrival rate (req/s) of each window of `observe_sequence`."""
    return [obs.arrival_rate_rps for obs in observe_sequence(bodies)]


def test_counters_that_fall_without_a_restart_make_an_unusable_window() -> None:
    first = exposition(PodTotals().plus(STEP, times=10), T0 - 3600)
    lower = exposition(PodTotals().plus(STEP, times=4), T0 - 3600)  # same process, went down
    (obs,) = observe_sequence([first, lower])
    assert Problem.COUNTERS_INCONSISTENT in obs.problems
    assert obs.observed_pods == 0 and obs.arrival_rate_rps == 0.0
    assert not obs.success  # nothing to size on: it holds


def test_two_pods_behind_one_url_never_inflate_the_rate() -> None:
    """A ClusterIP Service in front of two pods: reads alternate between two processes whose
    counters differ. Today's true rate is 2 req/s per pod; nothing may read far above it."""
    pods = [PodTotals().plus(STEP, times=40), PodTotals().plus(STEP, times=5)]
    starts = [T0 - 7200, T0 - 3600]
    bodies = []
    for k in range(8):  # read k answers pod k % 2; both served STEP more per window
        bodies.append(exposition(pods[k % 2], starts[k % 2]))
        pods = [p.plus(STEP) for p in pods]
    rates = read_sequence(bodies)
    assert max(rates) <= 2 * 2.0 + 1e-9, rates  # the old reading charged ~100-700 req/s


def test_a_return_to_the_higher_of_two_same_start_processes_is_not_a_burst() -> None:
    """Two pods of one rollout started in the same second, behind one URL: their start times
    cannot tell them apart. After a fall, reads of the lower pod look consistent among
    themselves; the next read of the higher pod must not charge their 35-window gap (70 req/s
    against a true 2) to one window."""
    high, low = PodTotals().plus(STEP, times=40), PodTotals().plus(STEP, times=5)
    reads = [high, low, low.plus(STEP), low.plus(STEP, times=2), low.plus(STEP, times=3)]
    reads.append(high.plus(STEP, times=5))
    rates = read_sequence([exposition(t, T0 - 3600) for t in reads])
    assert max(rates) <= 2.0 + 1e-9, rates


def test_same_start_pods_behind_one_url_read_by_two_clients_never_inflate_the_rate() -> None:
    """The soak's case: the sizer's cycle and a second reader (its arrival sampler, another
    scraper) share one round-robin URL, so which pod a cycle reads is a matter of timing."""
    rng = random.Random(7)
    pods = [PodTotals().plus(STEP, times=40), PodTotals().plus(STEP, times=5)]
    bodies = []
    turn = 0
    for _ in range(60):
        turn += rng.randint(0, 3)  # the other reader's reads since the last cycle
        bodies.append(exposition(pods[turn % 2], T0 - 3600))
        turn += 1
        pods = [p.plus(STEP) for p in pods]
    rates = read_sequence(bodies)
    assert max(rates) <= 2.0 + 1e-9, rates


def test_a_url_that_fell_once_is_trusted_again_after_consistent_windows() -> None:
    """One fall (a pod swapped behind the URL for one read) holds the pod out until its counters
    have risen consistently for a few windows; then its load counts again."""
    steady = [PodTotals().plus(STEP, times=10 + k) for k in range(12)]
    steady[2] = PodTotals().plus(STEP, times=1)  # one read from another same-start process
    rates = read_sequence([exposition(t, T0 - 3600) for t in steady])
    assert rates[-1] == pytest.approx(2.0)
    assert max(rates) <= 2.0 + 1e-9, rates
    assert rates[1] == 0.0  # the fall itself


def test_a_jump_between_same_start_pods_that_only_the_sampler_saw_fall_is_not_used() -> None:
    """Sidecar mode: the cycle's first two reads hit the lower pod, then the higher one (an
    ordinary-looking rise of 35 windows' requests); the 1 s arrival sampler between them read
    the two pods in turn and saw the counter fall. The soak's faulty deployments asked for 4-5
    replicas this way."""
    pods = [PodTotals().plus(STEP, times=5), PodTotals().plus(STEP, times=40)]
    turn = {"k": 0}

    def body() -> str:
        k = turn["k"] % 2
        turn["k"] += 1
        return exposition(pods[k], T0 - 3600)

    clock = ManualClock(T0)
    with FaultServer(Fault.SERVE, body) as server:
        dep = deployment("d", server.url, initial_params=None)
        config = Config(cycle_period_s=W, deployments=(dep,))
        sampler = ArrivalSampler(server.url, clock=clock, model_name="m")
        daemon = Daemon(config, sources(config, clock), CollectorRegistry(), clock,
                        samplers={"d": sampler})  # fmt: skip
        rates = []
        for _ in range(6):  # cycle reads pods 0, 1, 0, 1, ...: 4 sampler reads between them
            daemon.run_cycle()
            obs = daemon.runtimes["d"].observation
            rates.append(obs.arrival_rate_rps if obs is not None else 0.0)
            for _ in range(4):
                clock.advance(W / 5)
                sampler.sample_once()
            clock.advance(W / 5)
            pods = [p.plus(STEP) for p in pods]
        daemon.close()
    assert max(rates) <= 2.0 + 1e-9, rates


def test_a_url_whose_counters_stay_below_the_old_ones_is_read_again_in_the_end() -> None:
    """A permanent switch to a lower same-start process is not held out for ever."""
    high = PodTotals().plus(STEP, times=50)
    reads = [high] + [PodTotals().plus(STEP, times=k) for k in range(1, 30)]
    rates = read_sequence([exposition(t, T0 - 3600) for t in reads])
    assert rates[-1] == pytest.approx(2.0)
    assert max(rates) <= 2.0 + 1e-9, rates


def test_a_real_restart_still_counts_from_zero() -> None:
    before = exposition(PodTotals().plus(STEP, times=20), T0 - 600)
    restarted = exposition(PodTotals().plus(STEP), T0 + 5)  # 60 completions since a restart
    (obs,) = observe_sequence([before, restarted])
    assert Problem.COUNTER_RESET in obs.problems
    assert obs.completion_rate_rps == pytest.approx(60 / W)


def test_a_pod_whose_metrics_fail_keeps_its_load_and_its_replica() -> None:
    state = {"a": PodTotals(), "b": PodTotals()}
    with (
        FaultServer(Fault.SERVE, lambda: render(state["a"])) as a,
        FaultServer(Fault.SERVE, lambda: render(state["b"])) as b,
    ):
        dep = replace(deployment("d", a.url), source=SourceConfig(scrape_urls=(a.url, b.url)))
        config = Config(cycle_period_s=30.0, deployments=(dep,))
        clock = ManualClock(T0)
        source = ScrapeSource(clock=clock, urls=[a.url, b.url], model_name="m", timeout_s=1.0)
        daemon = Daemon(config, {"d": source}, CollectorRegistry(), clock)
        heavy = STEP
        for _ in range(4):  # both pods busy: 2 x 2 req/s
            clock.advance(W)
            state = {k: v.plus(heavy, times=3) for k, v in state.items()}
            before = daemon.run_cycle().deployments[0].decision
        b.fault = Fault.HANG
        clock.advance(W)
        state = {k: v.plus(heavy, times=3) for k, v in state.items()}
        after = daemon.run_cycle().deployments[0]
        daemon.close()
    assert after.decision.current_replicas == 2  # the hung pod still exists
    assert after.decision.arrival_rate_rps == pytest.approx(before.arrival_rate_rps, rel=0.05)
    assert after.decision.desired_replicas is not None and before.desired_replicas is not None
    assert after.decision.desired_replicas >= before.desired_replicas


def test_a_blip_or_a_restart_keeps_the_recommendation(tmp_path: Path) -> None:
    state = {"totals": PodTotals()}
    with FaultServer(Fault.SERVE, lambda: render(state["totals"])) as pod:
        dep = deployment("d", pod.url, scale_down_stabilization_s=300.0)
        config = Config(cycle_period_s=30.0, state_file=tmp_path / "s.json", deployments=(dep,))
        clock = ManualClock(T0)
        daemon = Daemon(config, sources(config, clock), CollectorRegistry(), clock,
                        StateFile(tmp_path / "s.json"))  # fmt: skip
        # A load that needs more than the one pod serving it: the model says so, and the pod's
        # own latencies (TTFT 80 ms against 60) do too, so the evidence does not contradict it.
        for _ in range(3):
            clock.advance(W)
            state["totals"] = state["totals"].plus(OVERLOADED, times=20)
            held = daemon.run_cycle().deployments[0].decision.desired_replicas
        assert held is not None and held > 1
        pod.fault = Fault.HANG  # a scrape blip: one cycle without a read ...
        clock.advance(W)
        daemon.run_cycle()
        pod.fault = Fault.SERVE  # ... then a first window again
        clock.advance(W)
        state["totals"] = state["totals"].plus(OVERLOADED, times=20)
        blip = daemon.run_cycle().deployments[0].decision
        assert blip.reason is Reason.FIRST_WINDOW and blip.desired_replicas == held
        daemon.close()
        # A restart (same clock, state file kept) holds the restored window's count at once.
        clock.advance(W)
        restarted = Daemon(config, sources(config, clock), CollectorRegistry(), clock,
                           StateFile(tmp_path / "s.json"))  # fmt: skip
        first = restarted.run_cycle().deployments[0].decision
        assert first.reason is Reason.FIRST_WINDOW and first.desired_replicas == held
        restarted.close()


def test_restored_history_is_clamped_to_the_bounds_and_the_window(tmp_path: Path) -> None:
    from exporter.sizing.recommender import Recommender

    dep = deployment("d", "http://127.0.0.1:1/", max_replicas=8, scale_down_stabilization_s=300)
    rec = Recommender(dep)
    now = T0
    rec.restore({"history": [[now - 10, 10], [now + 3600, 1000], [now - 900, 9]]}, now)
    assert rec.to_dict() == {"history": [[now - 10, 8]]}


@pytest.mark.parametrize(("cap_mib", "too_large"), [(1, True), (4, False)])
def test_the_configured_body_cap_bounds_every_scrape(cap_mib: int, too_large: bool) -> None:
    body = "# a comment line of a 2 MiB exposition\n" * (2 * MIB // 40)
    with FaultServer(Fault.SERVE, [body]) as server:
        config = Config(
            max_response_bytes=cap_mib * MIB, deployments=(deployment("big", server.url),)
        )
        read = build_sources(config, ManualClock(T0))["big"].read()
    reasons = [f.reason for f in read.failures]
    assert (FailureReason.BODY_TOO_LARGE in reasons) is too_large, reasons
