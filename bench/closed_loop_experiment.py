"""EXPERIMENT, not shipped: two candidate fixes for the cold start of the queueing arm, tried in
the closed-loop bench only (bench/closed_loop.py, arms "exp-fix" and "exp-fix+la").

1. `ShapeTuner` (tuner): on one request shape beta and gamma are nearly collinear in the ITL
   (both scale with the batch size; gamma through the batch's mean context, which the shape
   fixes), so the identifiability gate keeps the tuner "warming" for as long as the shape does
   not move. The experiment also accepts a converged fit whose alpha is identified and which
   reproduces its window (mean TTFT and ITL errors at most SHAPE_FIT_TOLERANCE), whatever the
   split between beta and gamma: any split on that line predicts this shape alike.
2. `BacklogRecommender` (recommender): while no estimate exists, a waiting queue that grows
   still adds a replica (the backlog rule otherwise needs parameters).
"""

from __future__ import annotations

from exporter.observations import DeploymentObservation
from exporter.recommender import Decision, Reason, Recommender, waiting_queue_grows
from model.fit import FitResult
from model.params import ServiceParams, Workload
from model.tuner import Tuner, TunerReason

SHAPE_FIT_TOLERANCE = 0.10  # mean relative TTFT and ITL error of the window fit


class ShapeTuner(Tuner):
    """EXPERIMENT: a Tuner that also accepts a fit identified only along its request shape."""

    def _judge(self, result: FitResult) -> TunerReason:
        verdict = super()._judge(result)
        if verdict not in (TunerReason.UNIDENTIFIED, TunerReason.OUT_OF_BOUNDS):
            return verdict
        within_upper = all(
            v <= hi
            for v, hi in zip(result.params.as_tuple(), self.upper_bounds.as_tuple(), strict=True)
        )
        if (
            result.success
            and result.identified[0]
            and within_upper
            and result.ttft_error.mean_ratio <= SHAPE_FIT_TOLERANCE
            and result.itl_error.mean_ratio <= SHAPE_FIT_TOLERANCE
        ):
            return TunerReason.ACCEPTED
        return verdict


class BacklogRecommender(Recommender):
    """EXPERIMENT: a Recommender whose backlog rule also works before the first estimate."""

    def _decide(
        self,
        now_s: float,
        obs: DeploymentObservation | None,
        params: ServiceParams | None,
        workload: Workload | None,
    ) -> Decision:
        decision = super()._decide(now_s, obs, params, workload)
        if (
            decision.reason is Reason.TUNER_WARMING
            and obs is not None
            and decision.current_replicas is not None
            and waiting_queue_grows(obs)
        ):
            current = decision.current_replicas
            # Replace this cycle's entry in the stabilization history with the larger count.
            self._history.pop()
            return self._stabilized(
                now_s,
                min(current + 1, self._dep.max_replicas),
                None,
                Reason.QUEUE_GROWING,
                current,
                obs.arrival_rate_rps,
            )
        return decision
