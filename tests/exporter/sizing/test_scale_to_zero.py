"""Scale to zero and back, decided by the recommender on scripted cycles in manual time.

Each cycle is 30 s of a ManualClock; the observations are what the daemon would build from
the pods' metrics (rate, requests in flight, no pod at all), the demand what the upstream
query would read (None: the query failed).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from exporter.base.clock import ManualClock
from exporter.collector.observations import DeploymentObservation, ObservationStatus
from exporter.config.values import DemandKind, ScaleFromZeroConfig, SourceConfig
from exporter.sizing.reasons import Reason
from exporter.sizing.recommender import Decision, Recommender
from exporter.sizing.scale_to_zero import PodsState, pods_state
from model import PAPER_MODEL, replicas_for_slo
from tests.exporter.sizing.test_recommender import LLAMA, SERVER, SHAPE, deployment, observation

CYCLE_S = 30.0
IDLE_S = 120.0  # four cycles
QUERY = "sum(rate(router_requests_total[1m]))"


def zero_deployment(demand: DemandKind = DemandKind.RATE, **overrides: object):  # type: ignore[no-untyped-def]
    values: dict[str, object] = {
        "source": SourceConfig(prometheus_selector='{namespace="inference"}'),
        "min_replicas": 0,
        "scale_down_stabilization_s": 0.0,
        "scale_from_zero": ScaleFromZeroConfig(demand_query=QUERY, idle_s=IDLE_S, demand=demand),
    }
    values.update(overrides)
    return deployment(**values)


def serving(rate_rps: float, pods: int, in_flight: float = 0.0) -> DeploymentObservation:
    status = ObservationStatus.OK if rate_rps > 0 else ObservationStatus.NO_LATENCY
    return replace(observation(rate_rps, pods, status=status), requests_in_flight=in_flight)


def no_pods() -> DeploymentObservation:
    return replace(observation(0.0, 0, status=ObservationStatus.NO_PODS), requests_in_flight=None)


class Cycles:
    """A recommender stepped one cycle (30 s of a ManualClock) at a time."""

    def __init__(self, rec: Recommender, clock: ManualClock | None = None) -> None:
        self.rec = rec
        self.clock = clock or ManualClock(1_000.0)

    def step(
        self,
        obs: DeploymentObservation | None,
        demand: float | None,
        *,
        params: bool = True,
    ) -> Decision:
        self.clock.advance(CYCLE_S)
        return self.rec.decide(
            self.clock.time(), obs, LLAMA if params else None, SHAPE if params else None,
            demand=demand,
        )  # fmt: skip

    def to_zero(self) -> None:
        """Serve, then idle until 0 stands."""
        self.step(serving(5.0, 1), 5.0)
        for _ in range(int(IDLE_S / CYCLE_S)):
            self.step(serving(0.0, 1), 0.0)
        assert self.step(serving(0.0, 1), 0.0).desired_replicas == 0


def test_pods_state_reads_the_observation() -> None:
    assert pods_state(None) is PodsState.UNREAD
    assert pods_state(no_pods()) is PodsState.NONE
    assert pods_state(serving(0.0, 2)) is PodsState.IDLE
    assert pods_state(serving(0.5, 2)) is PodsState.BUSY
    assert pods_state(serving(0.0, 2, in_flight=1.0)) is PodsState.BUSY
    assert pods_state(replace(serving(0.0, 2), requests_in_flight=None)) is PodsState.UNKNOWN
    assert pods_state(replace(serving(0.0, 2), unobserved_pods=1)) is PodsState.UNKNOWN
    warming = observation(0.0, 1, status=ObservationStatus.WARMING_UP)
    assert pods_state(warming) is PodsState.UNKNOWN


def test_zero_only_after_idle_s_of_no_demand_and_no_request() -> None:
    run = Cycles(Recommender(zero_deployment()))
    assert run.step(serving(5.0, 1), 5.0).desired_replicas == 1
    seen = []
    for _ in range(int(IDLE_S / CYCLE_S)):  # the idle count starts at the first idle cycle
        decision = run.step(serving(0.0, 1), 0.0)
        seen.append((decision.desired_replicas, decision.reason))
    assert seen == [(1, Reason.IDLE)] * 4, "0 before idle_s had passed"
    decision = run.step(serving(0.0, 1), 0.0)  # 120 s after the first idle cycle
    assert (decision.desired_replicas, decision.reason) == (0, Reason.SCALED_TO_ZERO)
    assert decision.current_replicas == 1
    # The pods go: 0 stays, and says so.
    decision = run.step(no_pods(), 0.0)
    assert (decision.desired_replicas, decision.reason) == (0, Reason.SCALED_TO_ZERO)
    assert decision.current_replicas == 0


@pytest.mark.parametrize(
    ("obs", "demand"),
    [
        (serving(0.0, 1, in_flight=1.0), 0.0),  # a request runs (or waits) at 0 demand
        (serving(0.2, 1), 0.0),  # requests arrive at the pods although the router reads 0
        (serving(0.0, 1), 0.3),  # the router sees demand
        (replace(serving(0.0, 1), unobserved_pods=1), 0.0),  # a pod could not be read
        (None, 0.0),  # the vLLM metrics could not be read at all
        (serving(0.0, 1), None),  # the demand query failed
    ],
    ids=["running", "arriving", "demand", "pod-unread", "source-down", "demand-failed"],
)
def test_never_zero_while_requests_run_arrive_or_cannot_be_seen(obs, demand) -> None:  # type: ignore[no-untyped-def]
    run = Cycles(Recommender(zero_deployment()))
    run.step(serving(5.0, 1), 5.0)
    counts = [run.step(obs, demand).desired_replicas for _ in range(3 * int(IDLE_S / CYCLE_S))]
    assert 0 not in counts and all(c is None or c >= 1 for c in counts), counts


def test_one_busy_cycle_restarts_the_idle_count() -> None:
    run = Cycles(Recommender(zero_deployment()))
    for _ in range(3):
        run.step(serving(0.0, 1), 0.0)
    run.step(serving(0.0, 1, in_flight=2.0), 0.0)  # one long request, seen once
    counts = [run.step(serving(0.0, 1), 0.0).desired_replicas for _ in range(5)]
    assert counts == [1, 1, 1, 1, 0]  # a full idle_s again, counted from the first idle cycle


def test_a_failed_demand_read_restarts_the_idle_count_and_never_makes_a_zero() -> None:
    run = Cycles(Recommender(zero_deployment()))
    for _ in range(4):
        run.step(serving(0.0, 1), 0.0)
    assert run.step(serving(0.0, 1), None).desired_replicas == 1  # would have been 0
    counts = [run.step(serving(0.0, 1), 0.0).desired_replicas for _ in range(5)]
    assert counts == [1, 1, 1, 1, 0]


def test_demand_at_zero_is_sized_from_the_kept_calibration_in_one_cycle() -> None:
    dep = zero_deployment(max_replicas=6)
    run = Cycles(Recommender(dep))
    run.to_zero()
    assert run.step(no_pods(), 0.0).desired_replicas == 0
    decision = run.step(no_pods(), 20.0)
    want = replicas_for_slo(20.0, LLAMA, SERVER, SHAPE, 50, 25, options=PAPER_MODEL).replicas
    assert want == 3
    assert (decision.desired_replicas, decision.reason) == (want, Reason.DEMAND_FROM_ZERO)
    assert decision.current_replicas == 0 and decision.arrival_rate_rps == 20.0
    # Pods starting (none ready yet) while the demand holds: the count holds.
    assert run.step(no_pods(), 20.0).desired_replicas == want
    # Ready: the pods' own metrics size it from now on.
    decision = run.step(serving(20.0, want), 20.0)
    assert decision.desired_replicas == want and decision.reason is Reason.AT_TARGET


@pytest.mark.parametrize(
    ("kind", "demand", "params", "want"),
    [
        (DemandKind.RATE, 0.01, True, 1),  # a trickle: at least one
        (DemandKind.RATE, 1e6, True, 6),  # more than replicas.max carries: the bound
        (DemandKind.RATE, 20.0, False, 1),  # no calibration yet: one, then its metrics
        (DemandKind.QUEUE, 40.0, True, 1),  # a queue length is no rate: one
    ],
    ids=["trickle", "flood", "uncalibrated", "queue"],
)
def test_from_zero_count(kind: DemandKind, demand: float, params: bool, want: int) -> None:
    run = Cycles(Recommender(zero_deployment(kind, max_replicas=6)))
    run.step(no_pods(), 0.0, params=params)  # a first start without pods
    decision = run.step(no_pods(), demand, params=params)
    assert (decision.desired_replicas, decision.reason) == (want, Reason.DEMAND_FROM_ZERO)


def test_a_first_start_without_pods_counts_a_full_idle_s_before_zero() -> None:
    # No pod seen may only mean that Prometheus has not scraped them yet.
    run = Cycles(Recommender(zero_deployment()))
    assert run.step(no_pods(), None).desired_replicas is None  # unknown demand: nothing
    decisions = [run.step(no_pods(), 0.0) for _ in range(5)]
    assert [(d.desired_replicas, d.reason) for d in decisions] == [
        *[(None, Reason.IDLE)] * 4,
        (0, Reason.SCALED_TO_ZERO),
    ]


def test_at_zero_a_failed_demand_read_keeps_zero_and_source_down_keeps_it_too() -> None:
    run = Cycles(Recommender(zero_deployment()))
    run.to_zero()
    decision = run.step(no_pods(), None)
    assert (decision.desired_replicas, decision.reason) == (0, Reason.DEMAND_UNKNOWN)
    assert run.step(None, None).desired_replicas == 0
    assert run.step(None, 0.0).desired_replicas == 0
    # The vLLM source is down but the demand query answers: back from zero all the same.
    assert run.step(None, 20.0).reason is Reason.DEMAND_FROM_ZERO


def test_pods_that_appear_at_zero_are_kept_until_seen_idle() -> None:
    run = Cycles(Recommender(zero_deployment()))
    run.to_zero()
    warming = observation(0.0, 2, status=ObservationStatus.WARMING_UP)
    decision = run.step(warming, 0.0)  # someone scaled up by hand: no window yet
    assert decision.desired_replicas == 2 and decision.reason is Reason.FIRST_WINDOW


def test_zero_and_the_idle_count_survive_a_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    dep = zero_deployment(scale_down_stabilization_s=600.0)
    clock = ManualClock(1_000.0)
    run = Cycles(Recommender(dep), clock)
    run.step(serving(20.0, 3), 20.0)  # the stabilization window holds 3 for 600 s
    run.to_zero()
    saved = run.rec.to_dict()
    assert saved["zero"]["at_zero"] is True and saved["history"]
    restarted = Cycles(Recommender(dep), clock)
    restarted.rec.restore(saved, clock.time())
    assert restarted.rec.to_dict() == saved
    # At zero at once: no second idle_s, no count from the restored history.
    decision = restarted.step(no_pods(), 0.0)
    assert (decision.desired_replicas, decision.reason) == (0, Reason.SCALED_TO_ZERO)
    # Demand: the restored stabilization history still holds 3 within its window.
    decision = restarted.step(no_pods(), 1.0)
    assert (decision.desired_replicas, decision.reason) == (3, Reason.DEMAND_FROM_ZERO)


def test_an_idle_count_is_saved_and_a_bad_saved_state_is_dropped() -> None:
    dep = zero_deployment()
    clock = ManualClock(1_000.0)
    run = Cycles(Recommender(dep), clock)
    run.step(serving(0.0, 1), 0.0)
    run.step(serving(0.0, 1), 0.0)
    saved = run.rec.to_dict()
    assert saved["zero"] == {"at_zero": False, "idle_since_s": 1_030.0}
    restarted = Cycles(Recommender(dep), clock)
    restarted.rec.restore(saved, clock.time())
    counts = [restarted.step(serving(0.0, 1), 0.0).desired_replicas for _ in range(3)]
    assert counts == [1, 1, 0]  # 120 s after the first idle cycle, restart or not
    for bad in ({"at_zero": "yes", "idle_since_s": "x"}, {"idle_since_s": 1e12}, [1, 2]):
        fresh = Recommender(dep)
        fresh.restore({"history": [], "zero": bad}, clock.time())
        assert fresh.to_dict()["zero"] == {"at_zero": False, "idle_since_s": None}


def test_without_scale_from_zero_nothing_changes() -> None:
    run = Cycles(Recommender(deployment()))
    decisions = [run.step(serving(0.0, 1), 0.0) for _ in range(20)]
    assert {d.desired_replicas for d in decisions} == {1}
    assert "zero" not in run.rec.to_dict()


@pytest.mark.parametrize("pods", [1, 2])
def test_at_zero_with_idle_pods_still_there_a_failed_demand_read_keeps_zero(pods: int) -> None:
    """Z1: KEDA's cooldown keeps the pods for minutes after 0; a demand query failing then (NaN,
    empty, two series, 500, hang) turned 0 into 1 for that cycle and restarted the cooldown."""
    run = Cycles(Recommender(zero_deployment()))
    run.to_zero()
    decisions = [run.step(serving(0.0, pods), demand) for demand in (None, 0.0, None, None, 0.0)]
    assert [d.desired_replicas for d in decisions] == [0] * 5
    assert decisions[0].reason is Reason.DEMAND_UNKNOWN
    # Requests at the pods are demand, whatever the query says.
    assert run.step(serving(0.5, pods), None).desired_replicas != 0
