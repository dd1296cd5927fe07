"""The hindsight-best fixed fleet: the cheapest N <= replicas.max whose fixed fleet meets every
target in at least `MIN_MET_SHARE` of the judged windows, on the same arrivals and from the same
initial count as the other policies.

Found by bisection over N, one replay of a fixed arm per N tried, on the premise that the share
met does not fall as replicas are added (same arrivals, round-robin routing, more servers):
the smallest N meeting the bar is then where the bisection ends (a test holds it to a brute
force over every N). When N = replicas.max misses it, the trace is
infeasible at that maximum and no policy is scored against a fixed fleet.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from exporter.replay.engine import ArrivalSource
from exporter.replay.policies import PolicyName
from exporter.replay.session import ReplayResult, replay
from exporter.replay.settings import ReplaySettings
from model.queueing.params import ServiceParams

MIN_MET_SHARE = 0.97
FIXED_BEST = "fixed_best"  # the report's key of the chosen fleet


@dataclass(slots=True)
class FixedBest:
    """The search's verdict: `n` (None: infeasible at `max_n`), each N tried with its share
    met, and the replay of the chosen N."""

    max_n: int
    n: int | None = None
    tried: dict[int, float | None] = field(default_factory=dict)
    result: ReplayResult | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "fixed_best_n": self.n,
            "feasible": self.n is not None,
            "max_replicas": self.max_n,
            "min_met_share": MIN_MET_SHARE,
            "tried": {str(n): share for n, share in sorted(self.tried.items())},
        }


def meets(share: float | None) -> bool:
    """A fleet meets the bar when it was judged and met it (no judged window: not shown)."""
    return share is not None and share >= MIN_MET_SHARE - 1e-12


def fixed_best(
    settings: ReplaySettings,
    truth: ServiceParams,
    arrivals: Callable[[], ArrivalSource],
    *,
    stop: Callable[[], bool] = lambda: False,
    start_at_n: bool = False,
) -> FixedBest:
    """Bisect N in [replicas.min, replicas.max]; `arrivals()` gives a fresh source each time
    (the same requests every time). Each fixed fleet starts from the settings' initial count,
    or with `start_at_n` from its own N (a fleet already running when the trace begins)."""
    dep = settings.deployment
    low, high = max(1, dep.min_replicas), dep.max_replicas
    found = FixedBest(max_n=high)
    runs: dict[int, ReplayResult] = {}

    def share(n: int) -> float | None:
        fleet = replace(settings, fixed_replicas=n,
                        initial_replicas=n if start_at_n else settings.initial_replicas)
        run = replay(fleet, truth, (PolicyName.FIXED,), arrivals(), stop=stop)
        runs[n] = run
        value = run.cards[PolicyName.FIXED.value].summary()["met_share"]
        found.tried[n] = value
        return value  # type: ignore[no-any-return]

    if not meets(share(high)):
        return found
    while low < high:
        middle = (low + high) // 2
        if meets(share(middle)):
            high = middle
        else:
            low = middle + 1
    found.n = high
    found.result = runs[high]
    return found


def scored(report: dict[str, Any], best: FixedBest, price: float | None) -> dict[str, Any]:
    """`report` (session.result_json) with the search's verdict, the chosen fleet as the
    policy `fixed_best`, and every policy's cost over the chosen fleet's."""
    out = dict(report) | best.to_json()
    policies = dict(out["policies"])
    base: float | None = None
    if best.result is not None:
        card = best.result.cards[PolicyName.FIXED.value]
        policies[FIXED_BEST] = card.summary(price) | {
            "replicas": best.n,
            "rejected_requests": best.result.rejected.get(PolicyName.FIXED.value, 0),
        }
        base = card.replica_hours
        out["series"] = dict(out["series"]) | {FIXED_BEST: card.series}
    out["policies"] = {
        name: entry | {"cost_ratio_vs_fixed_best": None if not base
                       else entry["replica_hours"] / base}
        for name, entry in policies.items()
    }
    return out
