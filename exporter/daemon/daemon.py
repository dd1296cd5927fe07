"""Composition root: one cycle = read every source, observe each deployment, decide, publish,
save. The observing and deciding are exporter/sizing/cycle.py's, below any I/O.

`Daemon` is given everything it needs (config, sources, registry, state file, clock) and never
sleeps: the scheduler at the edge (commands/run.py, commands/demo.py) calls `run_cycle()`. A
deployment that fails is logged, counted and skipped; the others go on, and every deployment
keeps its calibration.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from types import MappingProxyType
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from exporter.base.clock import Clock
from exporter.base.errors import FailureReason, SourceError
from exporter.collector.arrival_sampler import ArrivalSampler
from exporter.collector.demand import DemandSource, DemandWatch
from exporter.collector.observations import DeploymentObservation, ObservationStatus, WindowTracker
from exporter.collector.sources import Source, pod_name_for_url
from exporter.config.values import Config, SourceKind
from exporter.daemon.cycle_reads import READ_DEADLINE, Reads, late_read, read_deployment
from exporter.daemon.deployment_state import (
    DeploymentRuntime,
    restore_fleet,
    restore_state,
    saved_state,
)
from exporter.daemon.exposition import CycleSnapshot, DeploymentStatus, SnapshotCollector
from exporter.daemon.fleet_reads import InventoryReader
from exporter.daemon.log_lines import FailureStreaks, InfeasibleTargets, log_unexpected
from exporter.daemon.operation_metrics import OperationMetrics, cycle_outcome
from exporter.daemon.statefile import StateFile
from exporter.sizing.cycle import Constraints, DeploymentCycle, Estimate, Sizer
from exporter.sizing.evidence import capacity_extrapolated
from exporter.sizing.fleet_cycle import attach_fleet
from exporter.sizing.fleet_whatif import MixAnswer, mix_from_plan
from exporter.sizing.recommender import Decision, saturated, slo_headroom_ratio
from exporter.sizing.what_if import ServedEstimate, WhatIf, predict
from model import TunerReason

logger = logging.getLogger(__name__)

# /readyz: ready while the last successful cycle is at most this many periods old.
READY_PERIODS = 3.0


class Daemon:
    """Runs cycles over every configured deployment and publishes their results."""

    def __init__(
        self,
        config: Config,
        sources: Mapping[str, Source],
        registry: CollectorRegistry,
        clock: Clock,
        statefile: StateFile | None = None,
        *,
        wall_clock: Clock | None = None,
        demand: Mapping[str, DemandSource] | None = None,
        samplers: Mapping[str, ArrivalSampler] | None = None,
        inventory: Mapping[str, DemandSource] | None = None,
    ) -> None:
        """`clock` drives the cycle (windows, readiness); `wall_clock` (default: `clock`) times
        what is exported, so a simulation's daemon still exports wall-clock timestamps;
        `demand` has the demand query of each deployment with scale_from_zero; `samplers`
        (sidecar mode, started by the caller) give deployments their arrival CV; `inventory`
        has the query of each accelerator type whose inventory is one (a `models` section)."""
        demand = demand or {}
        missing = [d.name for d in config.deployments if d.scale_from_zero and d.name not in demand]
        if missing:
            raise ValueError(
                f"`demand` must have a source for each scale_from_zero deployment, "
                f"got none for {', '.join(missing)}"
            )
        self.config = config
        self._clock = clock
        self._wall_clock = wall_clock or clock
        self._statefile = statefile
        self._samplers = dict(samplers or {})
        self.collector = SnapshotCollector()
        registry.register(self.collector)
        self.metrics = OperationMetrics(registry, config.deployments)
        self._failures = FailureStreaks(logger)
        self._infeasible = InfeasibleTargets(logger)
        self._readers = ThreadPoolExecutor(
            max_workers=max(1, len(config.deployments)),
            thread_name_prefix="vllm-sizer-read",
        )
        self._last_success_mono: float | None = None
        # What /api/v1/predict answers from: replaced whole once per cycle, read by HTTP threads.
        self._served: Mapping[str, ServedEstimate] = MappingProxyType({})
        self.sizer = Sizer(config.deployments)
        self.fleet = attach_fleet(self.sizer, config.fleet)
        self.inventory = InventoryReader(config.fleet, inventory or {}, registry)
        self.runtimes = {
            dep.name: DeploymentRuntime(
                config=dep,
                source=sources[dep.name],
                tracker=WindowTracker(dep.name),
                cycle=self.sizer.cycles[dep.name],
                demand=demand.get(dep.name) if dep.scale_from_zero else None,
                demand_watch=DemandWatch(dep.name) if dep.scale_from_zero else None,
            )
            for dep in config.deployments
        }
        self._restore()

    # -- one cycle -------------------------------------------------------------------------

    def run_cycle(self) -> CycleSnapshot:
        """Read every deployment's source in parallel, observe each deployment's window, decide
        over all of them; publish and save."""
        start = self._wall_clock.monotonic()
        now_s = self._clock.time()
        reads = self._read_all(now_s - self.config.cycle_period_s)
        estimates: dict[str, Estimate] = {}
        for name, runtime in self.runtimes.items():
            try:
                estimates[name] = self._observe(runtime, now_s, reads[name])
            except Exception as exc:  # the per-deployment guard, the only catch-all
                self._cycle_failed(name, exc)
        constraints = None
        if self.fleet is not None:
            constraints = Constraints(inventory=self.inventory.read())
        decisions = self.sizer.decide(estimates, constraints, on_error=self._cycle_failed)
        observed_any = False
        statuses: list[DeploymentStatus] = []
        for name, runtime in self.runtimes.items():
            if name in decisions:
                self._log(runtime, decisions[name])
                observed_any |= _observed(estimates[name])
            if runtime.cycle.recommender.last is not None:  # a first cycle that failed has none
                statuses.append(
                    deployment_status(runtime.cycle, runtime.observation, runtime.demand_value)
                )
        fleet = None if self.fleet is None else self.fleet.last
        snapshot = CycleSnapshot(tuple(statuses), fleet)
        self.collector.publish(snapshot)
        self._served = MappingProxyType({
            name: ServedEstimate(
                config=runtime.config, tuner=runtime.cycle.tuner.estimate(),
                workload=runtime.cycle.workload, inputs=runtime.cycle.inputs,
                current_replicas=_current_replicas(runtime),
                slope_known=runtime.cycle.slope_known,
            )
            for name, runtime in self.runtimes.items()
        })  # fmt: skip
        self._save()
        outcome = cycle_outcome(
            observed_any, [runtime.observation for runtime in self.runtimes.values()]
        )
        if observed_any:
            self.metrics.last_success.set(self._wall_clock.time())
            self._last_success_mono = self._clock.monotonic()
        self.metrics.observe_cycle(self._wall_clock.monotonic() - start, outcome)
        return snapshot

    def close(self) -> None:
        """Stop the reader threads without waiting for a read still in flight."""
        self._readers.shutdown(wait=False, cancel_futures=True)

    def _read_all(self, past_s: float) -> dict[str, Future[Reads]]:
        """Start every deployment's read and wait for all of them, at most READ_DEADLINE of a
        period: one slow source never holds up the others' cycles."""
        futures: dict[str, Future[Reads]] = {}
        for name, runtime in self.runtimes.items():
            pending = runtime.pending_read
            if pending is not None and not pending.done():
                futures[name] = pending  # still on last cycle's read: no second one in flight
                continue
            runtime.pending_read = self._readers.submit(read_deployment, runtime, past_s)
            futures[name] = runtime.pending_read
        wait(futures.values(), timeout=READ_DEADLINE * self.config.cycle_period_s)
        return futures

    def _cycle_failed(self, name: str, exc: Exception) -> None:
        """A deployment whose cycle raised: logged and counted; it publishes its last decision,
        if any, and the other deployments go on."""
        log_unexpected(logger, f"{name}: cycle failed", exc)
        runtime = self.runtimes.get(name)
        if runtime is None:  # the fleet plan: its variants keep their own decisions
            return
        dep = runtime.config
        self.metrics.scrape_errors.labels(dep.name, dep.source.kind, FailureReason.INTERNAL).inc()
        runtime.observation = None

    def _observe(self, runtime: DeploymentRuntime, now_s: float, future: Future[Reads]) -> Estimate:
        """Turn one deployment's reads into its window, count what the window showed and hand
        it to the deployment's cycle; `runtime.observation` is this cycle's (None when its
        source failed)."""
        dep, cycle = runtime.config, runtime.cycle
        reads = future.result() if future.done() else None
        demand = self._demand(runtime, reads)
        try:
            if reads is None:
                raise late_read()
            if isinstance(reads.now, SourceError):
                raise reads.now
            history, read = reads.history, reads.now
        except SourceError as exc:
            self._failures.failed(dep.name, exc.reason, str(exc))
            self.metrics.scrape_errors.labels(dep.name, dep.source.kind, exc.reason).inc()
            runtime.observation = None
            return cycle.observe(None, now_s, demand=demand)
        self._failures.succeeded(dep.name)
        if history is not None and not runtime.tracker.primed:
            runtime.tracker.observe(history)  # the first cycle already closes a whole window
        for failure in read.failures:
            self.metrics.scrape_errors.labels(dep.name, dep.source.kind, failure.reason).inc()
        obs = runtime.tracker.observe(read, self._sampler_falls(runtime, read.time_s))
        runtime.observation = obs
        for problem in obs.problems:
            self.metrics.observation_problems.labels(dep.name, problem).inc()
        if obs.status is ObservationStatus.MODEL_NOT_FOUND:
            self.metrics.scrape_errors.labels(
                dep.name, dep.source.kind, FailureReason.MODEL_NOT_FOUND
            ).inc()
        estimate = cycle.observe(
            obs, now_s, dispersion=self._dispersion(runtime, obs), demand=demand,
            prompt_tokens=self._prompt_tokens(runtime, obs),
        )
        for message in estimate.warnings:
            logger.warning("%s", message)
        for problem in estimate.problems:
            self.metrics.observation_problems.labels(dep.name, problem).inc()
        return estimate

    def _demand(self, runtime: DeploymentRuntime, reads: Reads | None) -> float | None:
        """This cycle's demand (None: no scale_from_zero, or the read failed: counted under
        source "demand" and logged once per run of failures)."""
        if runtime.demand_watch is None:
            return None
        outcome = late_read() if reads is None or reads.demand is None else reads.demand
        if isinstance(outcome, SourceError):
            dep = runtime.config
            self.metrics.scrape_errors.labels(dep.name, SourceKind.DEMAND, outcome.reason).inc()
            runtime.demand_watch.failed(outcome)
            runtime.demand_value = None
        else:
            runtime.demand_watch.answered()
            runtime.demand_value = outcome.value
        return runtime.demand_value

    def _sampler_falls(self, runtime: DeploymentRuntime, end_s: float) -> frozenset[str]:
        """The deployment's pod, if its arrival sampler saw the counter fall since the last
        read: a second process behind the URL that the cycle's two reads may have missed."""
        sampler = self._samplers.get(runtime.config.name)
        start_s = runtime.tracker.last_read_s
        if sampler is None or start_s is None or not sampler.fell(start_s, end_s):
            return frozenset()
        return frozenset({pod_name_for_url(sampler.url)})

    def _dispersion(
        self, runtime: DeploymentRuntime, obs: DeploymentObservation
    ) -> tuple[float, float] | None:
        """The sampler's (index of dispersion, requests) over the observation's window, if
        the deployment has a sampler and the window a reading; a gap is a counted problem."""
        sampler = self._samplers.get(runtime.config.name)
        if sampler is None or not obs.observed_pods:
            return None
        reading = sampler.reading(obs.end_time_s - obs.window_s, obs.end_time_s)
        if reading.problem is not None:
            self.metrics.observation_problems.labels(runtime.config.name, reading.problem).inc()
        if reading.index is None:
            return None
        return reading.index, reading.requests

    def _prompt_tokens(
        self, runtime: DeploymentRuntime, obs: DeploymentObservation
    ) -> tuple[np.ndarray, float] | None:
        """The sampler's prompt tokens per second over the observation's window (the bursts'
        reading, exporter.sizing.bursts), if the deployment has a sampler and the window a
        clean series (a gap is counted by `_dispersion`)."""
        sampler = self._samplers.get(runtime.config.name)
        if sampler is None or not obs.observed_pods:
            return None
        tokens = sampler.prompt_tokens(obs.end_time_s - obs.window_s, obs.end_time_s)
        return None if tokens is None else (tokens, sampler.period_s)

    def _log(self, runtime: DeploymentRuntime, d: Decision) -> None:
        obs, params, dep = runtime.observation, runtime.cycle.params, runtime.config
        if d.sizing_rate_rps is not None:
            rate, targets = d.sizing_rate_rps, d.infeasible_targets
            self._infeasible.note(dep.name, targets, dep.max_replicas, rate)
        logger.info(
            "deployment=%s rate_rps=%s replicas=%s->%s reason=%s ttft_ms=%s/%s itl_ms=%s/%s "
            "params_ms=%s tuner=%s",
            runtime.config.name,
            _fmt(d.arrival_rate_rps),
            "-" if d.current_replicas is None else d.current_replicas,
            "-" if d.desired_replicas is None else d.desired_replicas,
            d.reason.value,
            _fmt(None if obs is None else obs.ttft_ms),
            _fmt(d.predicted_ttft_ms),
            _fmt(None if obs is None else obs.itl_ms),
            _fmt(d.predicted_itl_ms),
            "-"
            if params is None
            else f"{params.alpha_ms:.4g},{params.beta_ms:.4g},{params.gamma_ms:.4g}",
            _tuner_text(runtime),
        )

    # -- health and what-if ----------------------------------------------------------------

    def ready(self) -> bool:
        """True while a cycle observed something within the last READY_PERIODS periods."""
        if self._last_success_mono is None:
            return False
        age = self._clock.monotonic() - self._last_success_mono
        return age <= READY_PERIODS * self.config.cycle_period_s

    def predict(
        self,
        deployment: str,
        rate_rps: float,
        replicas: int | None,
        quantiles: tuple[float, ...] = (),
    ) -> WhatIf:
        """What-if at a total rate from the estimate the last cycle published, with the model's
        percentiles at `quantiles` (LookupError if impossible). Safe on any thread: it reads
        one published value and nothing the cycle mutates."""
        served = self._served.get(deployment)
        if served is not None:
            return predict(served, rate_rps, replicas, quantiles)
        if deployment in self.runtimes:  # configured, but no cycle has published yet
            raise LookupError(f"deployment {deployment!r} has no calibrated model yet")
        raise LookupError(f"unknown deployment {deployment!r}")

    def predict_mix(self, model: str, rate_rps: float) -> MixAnswer:
        """The cheapest mix of `model`'s variants for `rate_rps` from the last published plan
        (LookupError without one). Safe on any thread: it reads one published value."""
        if self.fleet is None or self.config.fleet is None:
            raise LookupError("no `models` section: no fleet plan to answer from")
        status = self.fleet.last
        inputs = None if status is None else status.inputs
        desired = {} if status is None else status.desired
        return mix_from_plan(self.config.fleet, inputs, desired, model, rate_rps)

    # -- persistence -----------------------------------------------------------------------

    def _save(self) -> None:
        if self._statefile is None:
            return
        try:
            self._statefile.save(saved_state(self.sizer.cycles, self.fleet))
        except OSError as exc:
            self.metrics.state_save_errors.inc()
            logger.error("cannot save state to %s: %s", self._statefile.path, exc)

    def _restore(self) -> None:
        if self._statefile is not None:
            saved, now_s = self._statefile.load(), self._clock.time()
            problems = restore_state(saved, self.sizer.cycles, now_s)
            if self.fleet is not None:
                problems += restore_fleet(saved, self.fleet, now_s)
            if problems:  # set aside, so the next start does not meet it again
                self._statefile.set_aside("; ".join(problems)[:500])


def deployment_status(
    cycle: DeploymentCycle, obs: DeploymentObservation | None, demand: float | None
) -> DeploymentStatus:
    """What a deployment publishes after its cycle: its last decision and sizing state, this
    cycle's observation (None: none) and demand (None: not read)."""
    dep = cycle.config
    decision = cycle.recommender.last
    assert decision is not None  # run_cycle publishes only deployments with a decision
    estimate = cycle.tuner.estimate()
    return DeploymentStatus(
        deployment=dep.name,
        model_name=dep.model_name,
        decision=decision,
        params=estimate.params,
        tuner_state=estimate.state,
        tuner_reason=estimate.reason,
        fit_ttft_error=estimate.fit_ttft_error,
        fit_itl_error=estimate.fit_itl_error,
        observed_ttft_ms=None if obs is None else obs.ttft_ms,
        observed_itl_ms=None if obs is None else obs.itl_ms,
        slo_ttft_ms=dep.slo.ttft_ms,
        slo_itl_ms=dep.slo.itl_ms,
        source_up=obs is not None and obs.read_pods > 0,
        pods_observed=0 if obs is None else obs.read_pods,
        saturated=saturated(decision, obs),
        slo_headroom_ratio=slo_headroom_ratio(decision),
        demand=demand,
        demand_kind=None if dep.scale_from_zero is None else dep.scale_from_zero.demand,
        traffic=cycle.traffic.shape,
        kv_batch_limit=None if cycle.inputs is None else cycle.inputs.kv_batch_limit,
        calibration_confidence=estimate.confidence,
        extrapolation_ratio=decision.capacity_extrapolation_ratio,
        capacity_extrapolated=capacity_extrapolated(decision.capacity_extrapolation_ratio),
        identified=None if estimate.params is None else estimate.identified,
        slo_percentiles=dep.slo.percentiles,
        observed_attainment=cycle.slo_window.attainment(dep.slo.percentiles),
        slo_window_requests=cycle.slo_window.requests(),
        headroom=cycle.headroom.state,
        prompt_burst_factor=None if cycle.burst is None else cycle.burst.factor,
        **_forecast_status(cycle),
    )


def _forecast_status(cycle: DeploymentCycle) -> dict[str, Any]:
    """The look-ahead's forecaster, horizon and recent error (none before a rate was read)."""
    strategy = cycle.forecaster
    if not strategy.choices:
        return {}
    return {"forecaster": strategy.chosen, "forecast_horizon_s": strategy.horizon_s,
            "forecast_error_ratio": strategy.error_ratio(strategy.chosen)}


def _current_replicas(runtime: DeploymentRuntime) -> int | None:
    last = runtime.cycle.recommender.last
    return None if last is None else last.current_replicas


def _observed(estimate: Estimate) -> bool:
    """Whether the cycle observed the deployment. At zero the demand is the observation: a read
    that found no pod and a demand read make a successful cycle (readiness, the KEDA query's
    freshness guard, the alerts)."""
    obs = estimate.observation
    if obs is None:
        return False
    empty = obs.status is ObservationStatus.NO_PODS and obs.ready_pods == 0
    return obs.success or (empty and estimate.demand is not None)


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return "inf" if math.isinf(value) else f"{value:.4g}"


def _tuner_text(runtime: DeploymentRuntime) -> str:
    """The tuner's state, with its reason unless the fit was simply accepted."""
    state, reason = runtime.cycle.tuner.state, runtime.cycle.tuner.reason
    return state.value if reason is TunerReason.ACCEPTED else f"{state.value}({reason.value})"
