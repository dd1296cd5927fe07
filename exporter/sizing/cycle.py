"""A sizing cycle's two phases, below any I/O: observe each window, decide over all. Each
deployment observes its window into an `Estimate`, then one decision is made over every
deployment's estimate.

`DeploymentCycle.observe` is pure state-keeping (no threads, clock or I/O): the deployment's
recent windows, its traffic shape, its tuner, the latency histograms of its SLO window, the
evidence its tuner points give and the headroom its misses ask for. `Sizer.decide` turns the
estimates into counts: today each deployment alone, by its recommender; a fleet plan across
deployments takes their estimates the same way. The daemon reads, observes, decides and
publishes (exporter/daemon/daemon.py); a replay calls the same two phases on the windows it
simulated (exporter/replay/policies.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from exporter.collector.observations import DeploymentObservation, ObservationStatus
from exporter.collector.pod_observation import Problem
from exporter.config.values import DeploymentConfig, ForecastMode
from exporter.sizing.attainment import SloWindow
from exporter.sizing.bursts import BurstReading, BurstTracker
from exporter.sizing.evidence import (
    PastMiss,
    identifies_growth,
    past_misses,
    spread_over_history,
)
from exporter.sizing.forecast_choice import ForecastStrategy, Outlook
from exporter.sizing.handover import Handover, handover
from exporter.sizing.headroom import HeadroomController
from exporter.sizing.history import RateHistory
from exporter.sizing.points import new_tuner, steady, tuner_observation
from exporter.sizing.recommender import Decision, Recommender
from exporter.sizing.traffic import ModelInputs, TrafficTracker, model_inputs, used_cvs
from model import Observation, PercentileTarget, ServiceParams, Workload
from model.calibration.estimate import TunerEstimate
from model.calibration.trust import ModelBias, is_trusted
from model.calibration.tuner import Tuner

# Tuner points whose misses bound the count once out of the tuner's window
# (exporter.sizing.evidence.past_misses): an hour of 30 s cycles, longer than that window.
EVIDENCE_WINDOWS = 120

# A window reaches the tuner when the per-pod load its latencies were made at, over the window
# and a request lifetime before it, is within this fraction of the window's own: latencies lag
# a load step by about a lifetime, and within a lifetime of steady load they do not. Judged per
# pod over the pods that served through the window, so pods coming or going (the others' share
# moves) and bursts shorter than the window do not keep a changing fleet from calibrating.
MAX_RATE_CHANGE = 0.25


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    """One deployment's state after observing a window: what its decision is made from.

    `observation` is None when the cycle read nothing (the source failed); the estimate then
    carries the tuner's parameters alone. `problems` and `warnings` are what the window showed
    that the caller counts and logs (the cycle itself neither counts nor logs)."""

    deployment: str
    now_s: float
    observation: DeploymentObservation | None
    calibration: TunerEstimate  # the tuner's, after this window
    params: ServiceParams | None  # the parameters sized with (the tuner's)
    bias: ModelBias | None = None
    workload: Workload | None = None  # the request shape sized for (None: not read)
    inputs: ModelInputs | None = None  # the model's options and limits for the traffic
    demand: float | None = None  # the scale_from_zero query's value (None: not read)
    shortfalls: Mapping[PercentileTarget, float] = field(default_factory=dict)
    handover: Handover | None = None  # what sizes while the calibration has no estimate
    evidence: Sequence[Observation] = ()  # the points that bound capacity
    misses: Sequence[PastMiss] = ()  # older misses, which bound the count
    trusted: bool = True
    slope_known: bool = False  # DeploymentCycle.slope_known
    headroom: float = 1.0  # the factor the rate is sized for times
    burst: BurstReading | None = None  # the measured bursts (None: no per-second readings)
    trend: Sequence[tuple[float, float]] = ()  # (time s, rate req/s) of recent windows
    outlook: Outlook | None = None  # the forecaster's (None: the window's rate was not read)
    problems: tuple[Problem, ...] = ()
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Constraints:
    """What holds across deployments when they are decided together: the GPUs per accelerator
    type this cycle (the fleet plan sizes a model's variants within them)."""

    inventory: Mapping[str, int] = field(default_factory=dict)


class CrossDeployment(Protocol):
    """A decision across deployments (the fleet plan: exporter/sizing/fleet_cycle.py)."""

    def transfer_priors(self) -> None:
        """Before the deployments decide: what one's calibration teaches another's prior."""

    def decide(
        self,
        now_s: float,
        estimates: Mapping[str, Estimate],
        decisions: dict[str, Decision],
        inventory: Mapping[str, int],
    ) -> object:
        """After they decided alone: replace the decisions it sizes, in place."""


class DeploymentCycle:
    """One deployment's sizing state: its recent windows, traffic shape, tuner, SLO window,
    evidence, headroom and recommender. `observe` a window, then `decide` on the estimate."""

    def __init__(
        self,
        config: DeploymentConfig,
        tuner: Tuner | None = None,
        *,
        forecaster: ForecastStrategy | None = None,
    ) -> None:
        """`forecaster` (default: the config's `forecaster` at look_ahead_s) gives the rate
        the look-ahead sizes for (exporter.sizing.forecast_choice)."""
        self.config = config
        self.tuner = tuner or new_tuner(config)
        self.recommender = Recommender(config)
        self.traffic = TrafficTracker()  # the request shape and the model's traffic inputs
        self.workload: Workload | None = None  # the shape sized for (restored, or the traffic's)
        self.inputs: ModelInputs | None = None  # what the model was last evaluated with
        self.rates = RateHistory()  # steadiness, tuner points' rates and the look-ahead's trend
        self.slo_window = SloWindow(config.slo.window_s)  # latency histograms over window_s
        # (tuner point, pods that served it)
        self.evidence: deque[tuple[Observation, int]] = deque(maxlen=EVIDENCE_WINDOWS)
        self.headroom = HeadroomController(config.slo)  # the capacity factor from misses
        # Prompt tokens per 5 s, where per-second readings exist: measured and exported, not
        # sized with (exporter.sizing.bursts says why).
        self.bursts = BurstTracker()
        self.burst: BurstReading | None = None  # the last reading
        self.forecaster = forecaster or ForecastStrategy(config.forecaster, config.look_ahead_s)
        self.growth_seen = False  # see slope_known

    @property
    def slope_known(self) -> bool:
        """How latency grows with load is known beyond the tuner's window: since the start a
        fit identified every parameter or the windows' arrival rates spread over more than one
        operating point (`growth_seen`), or the operator configured `initial_params`; either
        holds the tuner's prior where a later partial fit leaves it open (after a detected
        change the window restarts at one load), so what is published needs no cut to the
        served rates (exporter.sizing.evidence, `Envelope.claim`). Not "an estimate was
        trusted": short windows' arrival noise spreads the ITL curve's occupancy rates enough
        for a partial fit at one load to count as spread (the laptop recipe's, 0.8)."""
        return self.growth_seen or self.config.initial_params is not None

    @property
    def params(self) -> ServiceParams | None:
        """The tuner's estimate (it starts from the configured initial parameters, if any)."""
        return self.tuner.params

    def observe(
        self,
        obs: DeploymentObservation | None,
        now_s: float,
        *,
        dispersion: tuple[float, float] | None = None,
        demand: float | None = None,
        prompt_tokens: tuple[np.ndarray, float] | None = None,
    ) -> Estimate:
        """Take one window in (None: the cycle read nothing) at time `now_s` (s): its request
        shape and rate, its traffic measurements (with the arrival sampler's (index of
        dispersion, requests) over it, if any), a tuner point when it is one; `demand` is the
        scale_from_zero query's value (None: not read); `prompt_tokens` the prompt tokens of
        each period of the window and the period (s), where per-second readings exist
        (exporter.sizing.bursts)."""
        if obs is None:
            return Estimate(
                deployment=self.config.name, now_s=now_s, observation=None,
                calibration=self.tuner.estimate(), params=self.params, demand=demand,
                slope_known=self.slope_known,
            )  # fmt: skip
        dep = self.config
        problems: list[Problem] = []
        warnings: list[str] = []
        if obs.windows:
            self.slo_window.add(obs.end_time_s, obs.windows)
        self.rates.add(obs, now_s)
        self.forecaster.startup.ready(now_s, obs.ready_pods)
        trend = self.rates.trend()
        outlook = None
        if trend and trend[-1][0] == now_s:  # the window's rate was read
            outlook = self.forecaster.observe(now_s, obs.arrival_rate_rps)
        shape = self.traffic.update(obs, dispersion)
        if self.traffic.unusable_shape is not None:
            warnings.append(f"{dep.name}: unusable request shape: {self.traffic.unusable_shape}")
        if self.traffic.workload is not None:  # else the restored one, if any
            self.workload = self.traffic.workload
        self.inputs = model_inputs(dep, shape, self.workload)
        self._tune(obs, problems, warnings)
        estimate, handover = self.tuner.estimate(), self.handover()
        misses = past_misses(estimate.window, self.evidence, dep.slo)
        if prompt_tokens is not None:
            self.bursts.add(*prompt_tokens)
        mean_prompt = None if self.workload is None else self.workload.avg_input_tokens
        burst = self.burst = self.bursts.reading(mean_prompt, shape.input_length_cv)
        headroom = self.headroom.observe(obs, self.recommender.last)  # sizing/headroom.py
        trusted = is_trusted(estimate.confidence)
        pods = max(obs.observed_pods, 1)
        self.growth_seen = (
            self.growth_seen
            or identifies_growth(estimate, obs.window_s, pods)
            or spread_over_history(self.evidence, obs.window_s)
        )
        return Estimate(
            deployment=dep.name, now_s=now_s, observation=obs, calibration=estimate,
            params=estimate.params, bias=estimate.bias, workload=self.workload,
            inputs=self.inputs, demand=demand,
            shortfalls=self.slo_window.shortfalls(dep.slo.percentiles), handover=handover,
            evidence=estimate.window, misses=misses, trusted=trusted,
            slope_known=self.slope_known, headroom=headroom.factor, burst=burst,
            trend=trend, outlook=outlook, problems=tuple(problems), warnings=tuple(warnings),
        )  # fmt: skip

    def decide(self, estimate: Estimate) -> Decision:
        """This deployment's decision alone, by its recommender; the model's percentiles at it
        are kept beside the observed ones (exporter.sizing.attainment)."""
        obs = estimate.observation
        outlook = estimate.outlook
        # The linear trend is the recommender's own look-ahead: left to it, unchanged.
        projected = None
        if outlook is not None and self.forecaster.mode is not ForecastMode.LINEAR_TREND:
            projected = outlook.projected_rps
        decision = self.recommender.decide(
            estimate.now_s, obs, estimate.params, estimate.workload, estimate.bias,
            estimate.inputs, demand=estimate.demand, shortfalls=estimate.shortfalls,
            handover=estimate.handover, evidence=estimate.evidence, misses=estimate.misses,
            trusted=estimate.trusted, slope_known=estimate.slope_known,
            headroom=estimate.headroom, trend=estimate.trend, projected_rps=projected,
            look_ahead_s=self.forecaster.horizon_s,
        )  # fmt: skip
        if obs is not None:
            self.slo_window.predicted(obs.end_time_s, decision.predicted_percentiles)
        return decision

    def asked(self, estimate: Estimate, decision: Decision) -> None:
        """The count published for the window: more than the ready pods starts the startup
        clock (exporter.sizing.startup)."""
        if estimate.observation is not None:
            self.forecaster.startup.asked(
                estimate.now_s, estimate.observation.ready_pods, decision.desired_replicas
            )

    def handover(self) -> Handover | None:
        """What the sizer counts on while the calibration has no estimate of its own (None: it
        has one). An estimate not trusted yet still sizes, bounded by its own windows' evidence
        (exporter.sizing.evidence): a fit at one operating point is never trusted on its own,
        and the prior knows this fleet less than that fit does. The tuner's estimate, once
        there, is only ever replaced by another (model.calibration.tuner), so the hand-over
        happens before the first estimate only."""
        tuner = self.tuner
        if tuner.params is not None:
            return None
        return handover(tuner.initial, tuner.prior.centre)

    def _tune(
        self, obs: DeploymentObservation, problems: list[Problem], warnings: list[str]
    ) -> None:
        """Feed the window to the tuner as a per-replica point when it is one, else tell the
        tuner a cycle passed without one (`Tuner.idle`: a recovery must not wait for points)."""
        if (point := self._point(obs, problems, warnings)) is None:
            self.tuner.idle()
        else:
            self.tuner.update(point)
            self.evidence.append((point, obs.observed_pods))

    def _point(
        self, obs: DeploymentObservation, problems: list[Problem], warnings: list[str]
    ) -> Observation | None:
        """The window as a tuner point, or None when it is not one to fit."""
        if obs.status is not ObservationStatus.OK or obs.observed_pods == 0:
            return None
        if obs.unobserved_pods:  # the load of some pods is an estimate: not a point to fit
            return None
        if None in (obs.ttft_ms, obs.itl_ms, obs.avg_input_tokens, obs.avg_output_tokens):
            return None
        if not steady(self.rates.per_pod(), obs, MAX_RATE_CHANGE):
            problems.append(Problem.NON_STATIONARY)
            return None
        cvs = used_cvs(self.config, self.traffic.shape)
        try:
            rates = self.rates.per_pod()
            return tuner_observation(obs, self.config.server.max_batch_size, cvs, rates)
        except ValueError as exc:
            warnings.append(f"{self.config.name}: observation not usable by the tuner: {exc}")
            problems.append(Problem.INVALID_OBSERVATION)
            return None


class Sizer:
    """Every deployment's cycle: observe each, then decide over all of them."""

    def __init__(self, deployments: Iterable[DeploymentConfig]) -> None:
        self.cycles = {dep.name: DeploymentCycle(dep) for dep in deployments}
        # The fleet plan over the variants among them, when there are (attached by
        # exporter.sizing.fleet_cycle.attach_fleet, which builds on this module).
        self.fleet: CrossDeployment | None = None

    def observe(
        self,
        deployment: str,
        obs: DeploymentObservation | None,
        now_s: float,
        *,
        dispersion: tuple[float, float] | None = None,
        demand: float | None = None,
        prompt_tokens: tuple[np.ndarray, float] | None = None,
    ) -> Estimate:
        """One deployment's window (DeploymentCycle.observe)."""
        return self.cycles[deployment].observe(
            obs, now_s, dispersion=dispersion, demand=demand, prompt_tokens=prompt_tokens
        )

    def decide(
        self,
        estimates: Mapping[str, Estimate],
        constraints: Constraints | None = None,
        *,
        on_error: Callable[[str, Exception], None] | None = None,
    ) -> dict[str, Decision]:
        """The decision of each deployment with an estimate, by deployment: without
        constraints across them, each alone by its recommender. A deployment whose decision
        raises is handed to `on_error` (when given: else the error propagates) and left out,
        so the others are still decided. With a fleet, its variants' counts are then the
        plan's within `constraints` (exporter/sizing/fleet_cycle.py)."""
        if self.fleet is not None:
            self.fleet.transfer_priors()  # before the variants' hand-overs read their priors
        decisions: dict[str, Decision] = {}
        for name, estimate in estimates.items():
            try:
                decisions[name] = self.cycles[name].decide(estimate)
            except Exception as exc:  # handed to the caller's per-deployment guard
                if on_error is None:
                    raise
                on_error(name, exc)
        if self.fleet is not None and estimates:
            now_s = max(e.now_s for e in estimates.values())
            inventory = {} if constraints is None else constraints.inventory
            try:
                self.fleet.decide(now_s, estimates, decisions, inventory)
            except Exception as exc:  # the plan fails alone: the variants keep their own counts
                if on_error is None:
                    raise
                on_error("fleet", exc)
        for name, decision in decisions.items():  # what is published, the plan's included
            self.cycles[name].asked(estimates[name], decision)
        return decisions
