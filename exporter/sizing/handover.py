"""The hand-over: what the sizer counts on while its calibration has no estimate yet.

While the tuner has no estimate of its own (it is warming), the deployment is still sized from
the load
(the observed arrival rate and request shape, through the same model and the same scale-down
stabilization as the trusted count), but with parameters the fleet's own latencies cannot move
from one window to the next: the configured seed (`initial_params`), else the tuner's prior
centre (physical, or generic). (A tuner that once had an estimate keeps one, so no estimate it
trusted is ever there to hand over with: exporter.sizing.cycle.) A count of requests in
flight would not do: they fall as replicas are added, so a count made from them undoes itself
(more replicas -> fewer in flight -> fewer replicas), a limit cycle at constant load.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from model.queueing.params import ServiceParams


class HandoverBasis(StrEnum):
    """Where the hand-over's per-replica capacity comes from."""

    SEED = "seed"  # the configured initial_params
    PRIOR = "prior"  # the tuner's prior centre (physical, or generic)


@dataclass(frozen=True, slots=True)
class Handover:
    """The parameters the hand-over sizes with, and where they come from."""

    params: ServiceParams
    basis: HandoverBasis


def handover(seed: ServiceParams | None, prior_centre: ServiceParams) -> Handover:
    """The hand-over's parameters: `seed`, else the prior's centre."""
    if seed is not None:
        return Handover(seed, HandoverBasis.SEED)
    return Handover(prior_centre, HandoverBasis.PRIOR)
