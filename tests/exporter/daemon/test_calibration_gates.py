"""Which windows reach the tuner: a fleet whose pods come and go every window, and bursty
arrivals, must still calibrate (replayed through the emulated exposition and the daemon)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from exporter.config.loader import parse_config
from exporter.config.values import DeploymentConfig
from exporter.replay.arrivals import ProfileArrivals
from exporter.replay.engine import ApplyAsIs, Arm, Engine, Proposal
from exporter.replay.exposition import ExpositionObserver
from exporter.replay.perfect import WindowView
from exporter.replay.policies import OursPolicy
from exporter.replay.session import fleet_settings
from exporter.replay.settings import parse_replay
from exporter.sizing.forecast import forecast
from model.calibration.trust import is_trusted
from model.queueing.params import ServiceParams
from model.simulation.workloads import LengthDist, LengthKind, RateProfile, RateSegment

TRUTH = ServiceParams(6.68, 0.0201, 5.52e-5)  # paper Table I, Llama-3.1-8B on H100
WINDOW_S = 30.0
KV_TOKENS = 449_200


def deployment(arrival_cv: float | None = None) -> DeploymentConfig:
    """`arrival_cv`: the configured arrival CV (the refined model's), None: not configured."""
    options = {"variant": "refined", "arrival_cv": arrival_cv}
    model = {} if arrival_cv is None else {"model": options}
    config = parse_config({
        "cycle_period_s": WINDOW_S,
        "deployments": [{
            "name": "d", "model_name": "m",
            "source": {"scrape_urls": ["http://vllm:8000/metrics"]},
            "server": {"max_num_seqs": 256, "max_num_batched_tokens": 8192},
            "slo": {"ttft_ms": 200, "itl_ms": 50},
            "replicas": {"min": 1, "max": 12},
        } | model],
    })  # fmt: skip
    return config.deployments[0]


class Scheduled:
    """The daemon observes, tunes and decides on every window, but the fleet follows a fixed
    schedule of counts (the membership changes on purpose)."""

    def __init__(self, dep: DeploymentConfig, counts: Sequence[int]) -> None:
        self.ours = OursPolicy(dep, WINDOW_S)
        self.name = "scheduled"
        self._counts = counts
        self._k = 0

    def decide(self, view: WindowView, now_s: float, provisioned: int) -> Proposal:
        self.ours.decide(view, now_s, provisioned)
        count = self._counts[self._k % len(self._counts)]
        self._k += 1
        return Proposal(value=count)


def run(
    policy: Scheduled | OursPolicy,
    rate_rps: float,
    windows: int,
    *,
    interarrival_cv: float = 1.0,
    startup_delay_s: float = 0.0,
    initial: int = 2,
) -> list[tuple[float, float | None]]:
    """Each window's (calibration confidence, published SLO capacity per replica)."""
    dep = deployment()
    settings = parse_replay({"startup_delay_s": startup_delay_s}, dep, WINDOW_S)
    arrivals = ProfileArrivals(
        RateProfile((RateSegment(windows * WINDOW_S, rate_rps, rate_rps),)),
        np.random.default_rng(1),
        input_lengths=LengthDist(LengthKind.LOGNORMAL, 1024.0, cv=1.0),
        output_lengths=LengthDist(LengthKind.LOGNORMAL, 512.0, cv=1.0),
        interarrival_cv=interarrival_cv,
    )  # fmt: skip
    observer = ExpositionObserver(model_name="m", kv_capacity_tokens=KV_TOKENS, deployment="d")
    engine = Engine(fleet_settings(settings, TRUTH), [Arm(policy, observer, ApplyAsIs(), initial)])
    ours = policy.ours if isinstance(policy, Scheduled) else policy
    seen = []
    try:
        for step in engine.steps(arrivals, windows * WINDOW_S):
            assert step.arms
            last = ours.cycle.recommender.last
            seen.append((
                ours.cycle.tuner.confidence(),
                None if last is None else last.max_rate_per_replica_rps,
            ))  # fmt: skip
    finally:
        ours.close()
    return seen


def true_capacity_rps(policy: OursPolicy) -> float:
    """One replica's SLO capacity with the true parameters, for the workload the daemon saw."""
    runtime = policy.cycle
    assert runtime.workload is not None
    plan = forecast(runtime.config, TRUTH, runtime.workload, None, size_for_rps=1.0,
                    per_replica_rps=1.0, inputs=runtime.inputs).plan  # fmt: skip
    return plan.capacity.rate_rps


def test_a_fleet_changing_every_window_is_trusted_within_10_windows() -> None:
    # 11 req/s over 2, 3, 4, 3 pods: per-pod loads of 5.5, 3.7 and 2.75 req/s, and in every
    # window a pod joins or leaves.
    seen = run(Scheduled(deployment(), (3, 4, 3, 2)), 11.0, 12)
    trusted = [k for k, (confidence, _) in enumerate(seen, start=1) if is_trusted(confidence)]
    assert trusted and trusted[0] <= 10, [round(c, 2) for c, _ in seen]


def test_bursty_arrivals_calibrate_within_20_windows_to_20_percent_of_the_capacity() -> None:
    # Inter-arrival CV 3 at 3 req/s: a 30-s window's count moves by about 30 % from the next
    # one's, more than the steadiness gate, while a request lifetime is a quarter of a window.
    policy = OursPolicy(deployment(arrival_cv=3.0), WINDOW_S)
    seen = run(policy, 3.0, 20, interarrival_cv=3.0, startup_delay_s=90.0, initial=1)
    trusted = [k for k, (confidence, _) in enumerate(seen, start=1) if is_trusted(confidence)]
    assert trusted and trusted[0] <= 20, [round(c, 2) for c, _ in seen]
    capacity, truth = seen[-1][1], true_capacity_rps(policy)
    assert capacity is not None and abs(capacity / truth - 1.0) <= 0.2, (capacity, truth)
