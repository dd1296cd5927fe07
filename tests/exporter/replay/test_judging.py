"""What a replay judges and reports: the same judged windows for every policy, the hindsight
search against a brute force, the hand-over share and reversals of a crafted series, and the
independent-users scaling."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from exporter.replay.arrivals import DrawnArrivals
from exporter.replay.engine import ApplyAsIs, Arm, Engine, Proposal
from exporter.replay.exposition import ExpositionObserver
from exporter.replay.hindsight import fixed_best, meets
from exporter.replay.perfect import WindowView
from exporter.replay.policies import PolicyName
from exporter.replay.scaling import burstiness, independent_users
from exporter.replay.scoring import Scorecard
from exporter.replay.session import fleet_settings, judged_from_s, replay
from exporter.replay.settings import ReplaySettings, load_settings
from model.queueing.params import ServiceParams
from model.simulation.workloads import RequestTrace
from tests.conftest import DATA_DIR

TRUTH = ServiceParams(6.68, 0.0201, 5.52e-5)


def _settings(max_replicas: int = 4) -> ReplaySettings:
    s = load_settings(DATA_DIR / "replay-sample.yaml")
    return replace(s, deployment=replace(s.deployment, max_replicas=max_replicas),
                   startup_delay_s=60.0)


def _poisson(rate_rps: float, span_s: float, seed: int = 3) -> RequestTrace:
    rng = np.random.default_rng(seed)
    times = np.sort(rng.uniform(0.0, span_s, rng.poisson(rate_rps * span_s)))
    return RequestTrace(times, rng.integers(200, 2000, times.size),
                        rng.integers(50, 400, times.size))


def test_every_policy_is_judged_on_the_same_windows_from_the_same_start() -> None:
    settings = _settings()
    trace = _poisson(4.0, 300.0)
    result = replay(settings, TRUTH, tuple(PolicyName), DrawnArrivals(trace))
    first = judged_from_s(settings)
    assert first == settings.window_s + settings.startup_delay_s == 90.0
    flags = {name: card.series["judged"] for name, card in result.cards.items()}
    expected = [k * settings.window_s >= first for k in range(result.windows)]
    assert all(f == expected for f in flags.values()), flags
    assert expected.count(False) == 3 and result.windows == 10
    for card in result.cards.values():
        assert card.all_judged == expected.count(True)
        assert card.series["provisioned"][0] == settings.initial_replicas
    # The fixed fleet pays its warm-up from the same count as everyone else.
    assert result.cards["fixed"].series["provisioned"][:2] == [1, settings.fixed_replicas]


def test_fixed_best_by_bisection_equals_a_brute_force_over_every_n() -> None:
    settings = _settings(max_replicas=5)
    trace = _poisson(9.0, 300.0)
    best = fixed_best(settings, TRUTH, lambda: DrawnArrivals(trace))
    shares = {}
    for n in range(1, 6):
        run = replay(replace(settings, fixed_replicas=n), TRUTH, (PolicyName.FIXED,),
                     DrawnArrivals(trace))
        shares[n] = run.cards["fixed"].summary()["met_share"]
    brute = min((n for n, share in shares.items() if meets(share)), default=None)
    assert brute is not None and 1 < brute < 5, shares  # a trace where N matters
    assert best.n == brute
    assert len(best.tried) < len(shares)  # found by search, not by trying every N
    assert all(shares[n] == share for n, share in best.tried.items())


def test_a_trace_no_fixed_fleet_serves_is_infeasible_and_not_scored() -> None:
    settings = _settings(max_replicas=1)
    best = fixed_best(settings, TRUTH, lambda: DrawnArrivals(_poisson(30.0, 240.0)))
    assert best.n is None and best.result is None and list(best.tried) == [1]
    assert best.to_json()["feasible"] is False


class _Scripted:
    """Proposes a given count and reason per window."""

    name = "scripted"

    def __init__(self, script: list[tuple[int, str]]) -> None:
        self._script = iter(script)

    def decide(self, view: WindowView, now_s: float, provisioned: int) -> Proposal:
        value, reason = next(self._script)
        return Proposal(value=value, reason=reason)


def test_handover_share_reasons_and_reversals_of_a_crafted_series() -> None:
    settings = _settings(max_replicas=6)
    script = [(2, "handover"), (4, "handover"), (1, "handover"), (1, "scaled"), (3, "scaled"),
              (3, "scaled"), (2, "scaled"), (5, "scaled")]
    # counts asked for: 1 -> 2 -> 4 -> 1 -> 1 -> 3 -> 3 -> 2 -> 5: up, up, down, up, down, up
    observer = ExpositionObserver(model_name="m", kv_capacity_tokens=settings.kv_capacity_tokens,
                                  deployment="d")
    engine = Engine(fleet_settings(settings, TRUTH),
                    [Arm(_Scripted(script), observer, ApplyAsIs(), 1)])
    card = Scorecard.new(settings.deployment.slo, settings.window_s, judged_from_s(settings))
    for step in engine.steps(DrawnArrivals(_poisson(2.0, 240.0)), duration_s=240.0):
        card.add(step.arms[0])
    summary = card.summary()
    assert summary["windows"] == 8
    assert summary["handover_share"] == 3 / 8
    assert summary["reason_share"] == {"handover": 3 / 8, "scaled": 5 / 8}
    assert summary["reversals"] == 4
    # Replicas asked for but not ready at the window's end (60 s to serve, 30-s windows).
    asked, ready = card.series["provisioned"], card.series["ready"]
    unready = sum(max(0, a - r) for a, r in zip(asked, ready, strict=True))
    assert unready > 0
    assert summary["unready_replica_hours"] == pytest.approx(unready * 30 / 3600)


def _bursty(seed: int = 5) -> RequestTrace:
    rng = np.random.default_rng(seed)
    starts = np.cumsum(rng.exponential(10.0, 60))
    times = np.sort(np.concatenate([s + rng.uniform(0, 1, rng.integers(20, 61))
                                    for s in starts]))
    return RequestTrace(times, np.full(times.size, 100), np.full(times.size, 10))


def test_independent_users_keep_the_mean_rate_and_lower_the_burstiness() -> None:
    trace = _bursty()
    span = float(trace.arrival_s[-1]) + 1.0
    rng = np.random.default_rng(0)
    for k in (3.0, 4.5):
        users = independent_users(trace, k, span, rng)
        assert len(users) == pytest.approx(k * len(trace), rel=0.05)
        assert users.arrival_s.min() >= 0 and users.arrival_s.max() < span
        assert np.all(np.diff(users.arrival_s) >= 0)
        copies = np.sort(np.repeat(trace.arrival_s, int(k)))  # copies: every burst k times
        assert burstiness(users.arrival_s) < 0.7 * burstiness(copies)
    thinned = independent_users(trace, 0.5, span, rng)
    assert len(thinned) == pytest.approx(0.5 * len(trace), rel=0.1)
    assert independent_users(trace, 1.0, span, rng).arrival_s.tolist() == \
        trace.arrival_s.tolist()
