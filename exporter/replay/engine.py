"""One replay engine: the simulator fleet of each policy driven window by window on the same
arrivals, each window observed, decided on and scaled (`vllm-sizer replay`,
bench/closed_loop.py).

Every policy ("arm") has its own fleet, its own observer and its own scaler; the arrivals are
pulled once per window from one source and offered to every fleet, so a streamed trace is read
once and never held whole. Inside a window the fleet is advanced sample by sample (gauges every
`sample_s`); at the window's end the observer turns the window into what the policy reads, the
policy proposes a metric value, and the scaler (the HPA's arithmetic, or "apply as is") sets the
replica count, which the fleet follows from then on (new replicas after the startup delay,
removed ones drain). `steps()` yields each window once every arm has done it, so a caller that
stops between two windows (Ctrl-C) holds a consistent partial run.

Idle stretches are skipped whole (`rest_windows`): once every arm has been at rest for that many
windows in a row (no arrival, no iteration, nothing pending in its fleet, every replica ready
and idle, the same count asked for and the same proposal each window), the windows up to
`rest_windows` before the next arrival are yielded as one `Step` of `windows` > 1, without
simulating or deciding them. `rest_windows` must cover every timer of the policies, scalers and
scorers (stabilization windows, idle delays, trailing percentile windows): an arm at rest that
long has a constant output, and the `rest_windows` windows stepped before the next arrival
fill every time-windowed memory as stepping through the stretch would have. Its cost is then
O(1) in the stretch's length (a trace with rows 1e9 s apart replays in seconds).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from exporter.replay.perfect import WindowView
from model.queueing.params import ServerConfig, ServiceParams
from model.queueing.validation import require_int_at_least, require_positive
from model.simulation.compiled_fleet import CompiledFleet, Fleet
from model.simulation.replica import IterationRecord, ReplicaState
from model.simulation.simulator import ReplicaStatus, Router, Simulator
from model.simulation.workloads import RequestTrace


class ArrivalSource(Protocol):
    """Requests in arrival order, pulled window by window (s from the replay's start)."""

    def until(self, end_s: float) -> RequestTrace:
        """The requests arriving after the previous call's end and at or before `end_s`."""
        ...

    @property
    def exhausted(self) -> bool:
        """True once every request has been returned."""
        ...

    def offered_rps(self, start_s: float, end_s: float) -> float:
        """The load offered over (start_s, end_s], req/s (for reports and plots)."""
        ...

    def next_arrival_s(self) -> float | None:
        """The next request's arrival time not yet returned; None when there is none or it
        is not known beforehand (then no idle stretch is skipped)."""
        ...


class Observer(Protocol):
    """A window of one fleet -> what its policy reads."""

    def observe(
        self,
        sim: Fleet,
        records: Sequence[IterationRecord],
        start_s: float,
        end_s: float,
        start_status: Sequence[ReplicaStatus],
        samples: Sequence[Sequence[ReplicaStatus]],
    ) -> WindowView: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Proposal:
    """What a policy asks the autoscaler for: a metric `value` against a per-replica `target`
    (the HPA's AverageValue: ceil(value / target) replicas), and why."""

    value: float
    target: float = 1.0
    reason: str = ""
    tuner_state: str = ""
    capacity_rps: float | None = None  # one replica's SLO capacity per the policy's model


class Policy(Protocol):
    """An autoscaling policy under test."""

    name: str

    def decide(self, view: WindowView, now_s: float, provisioned: int) -> Proposal: ...


class Scaler(Protocol):
    """Turns a proposal into the replica count the Deployment gets."""

    def scale(self, now_s: float, current: int, proposal: Proposal) -> int: ...


class ApplyAsIs:
    """No autoscaler in between: the count asked for, ceil(value / target), at once."""

    def scale(self, now_s: float, current: int, proposal: Proposal) -> int:
        return max(0, math.ceil(proposal.value / proposal.target))


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetSettings:
    """The serving truth every arm's fleet simulates, and the window's timing (s)."""

    params: ServiceParams
    server: ServerConfig
    kv_capacity_tokens: int
    startup_delay_s: float
    window_s: float
    sample_s: float = 1.0  # gauge samples inside a window
    max_jump_s: float = 1.0  # decode runs are cut so the gauges move smoothly
    router: Router = Router.ROUND_ROBIN
    # False: the Python event loop and the numpy replica step (`Simulator`, a reference).
    compiled_step: bool = True

    def __post_init__(self) -> None:
        require_positive("window_s", self.window_s)
        require_positive("sample_s", self.sample_s)
        require_int_at_least("kv_capacity_tokens", self.kv_capacity_tokens, 1)
        steps = self.window_s / self.sample_s
        if abs(steps - round(steps)) > 1e-9:
            raise ValueError(
                f"`window_s` must be a whole number of sample_s ({self.sample_s:g} s), "
                f"got {self.window_s:g}"
            )


@dataclass(frozen=True, slots=True)
class Arm:
    """A policy, how its windows are observed and how its proposal is applied."""

    policy: Policy
    observer: Observer
    scaler: Scaler
    initial_replicas: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class ArmWindow:
    """One arm over one window and the decision at its end."""

    arm: str
    start_s: float
    end_s: float
    provisioned: int  # replicas asked for during the window (starting + ready)
    desired: int  # asked for at the window's end, from then on
    proposal: Proposal
    view: WindowView
    records: Sequence[IterationRecord]  # the fleet's iterations in the window
    sim: Fleet  # the arm's fleet (read it, never drive it)


@dataclass(frozen=True, slots=True)
class Step:
    """One window of every arm, in the order the arms were given."""

    index: int
    start_s: float
    end_s: float
    offered_rps: float
    arrivals: int
    arms: tuple[ArmWindow, ...]
    input_tokens: int = 0  # summed over the window's arrivals
    output_tokens: int = 0
    # > 1: an idle stretch skipped whole, from `start_s` to `end_s`; `index` is its first
    # window, and each arm's window is the rest window repeated (no records, same decision).
    windows: int = 1


@dataclass(slots=True)
class _Running:
    arm: Arm
    sim: Fleet
    provisioned: int
    status: list[ReplicaStatus] = field(default_factory=list)
    last: ArmWindow | None = None  # the arm's last window stepped

    def at_rest(self, previous: ArmWindow | None) -> bool:
        """The last window was idle and changed nothing: no iteration, nothing pending, every
        replica ready and idle (or removed), the count and the proposal as the window before."""
        w = self.last
        return (
            w is not None and previous is not None
            and not w.records and w.desired == w.provisioned == previous.desired
            and w.proposal == previous.proposal
            and self.sim.peek() == math.inf
            and all(r.running == 0 and r.waiting == 0
                    and r.state in (ReplicaState.READY, ReplicaState.REMOVED)
                    for r in self.status)
        )


class Engine:
    """Drives the arms' fleets through the arrivals, window by window."""

    def __init__(
        self,
        fleet: FleetSettings,
        arms: Sequence[Arm],
        *,
        rest_windows: int | None = None,
        rest_vote: Callable[[bool], bool] | None = None,
    ) -> None:
        """`rest_windows`: skip idle stretches once every arm has been at rest that many
        windows (see the module docstring); None never skips. `rest_vote`: given whether this
        engine's arms were at rest in a window, whether every arm of the replay was (arms
        run in several processes, exporter/replay/parallel.py, skip stretches together)."""
        self._vote = rest_vote
        if rest_windows is not None:
            require_int_at_least("rest_windows", rest_windows, 1)
        self.rest_windows = rest_windows
        self.windows_stepped = 0  # windows simulated and decided (skipped ones not counted)
        if not arms:
            raise ValueError("`arms` must hold at least one arm, got none")
        names = [a.policy.name for a in arms]
        if len(set(names)) != len(names):
            raise ValueError(f"arm names must be unique, got {names}")
        self.fleet = fleet
        self._running = [self._start(arm) for arm in arms]

    def _start(self, arm: Arm) -> _Running:
        f = self.fleet
        replicas = require_int_at_least("initial_replicas", arm.initial_replicas, 0)
        sim: Fleet
        if f.compiled_step:
            sim = CompiledFleet(f.params, f.server, replicas=replicas, router=f.router,
                                kv_capacity_tokens=f.kv_capacity_tokens,
                                startup_delay_s=f.startup_delay_s, max_jump_s=f.max_jump_s)
        else:
            sim = Simulator(f.params, f.server, replicas=replicas, router=f.router,
                            kv_capacity_tokens=f.kv_capacity_tokens,
                            startup_delay_s=f.startup_delay_s, max_jump_s=f.max_jump_s,
                            record_iterations=True, compiled_step=False)
        return _Running(arm, sim, arm.initial_replicas, sim.replica_status())

    def fleets(self) -> list[tuple[str, Fleet]]:
        """Each arm's name and fleet (read them, never drive them)."""
        return [(run.arm.policy.name, run.sim) for run in self._running]

    def steps(self, arrivals: ArrivalSource, duration_s: float | None = None) -> Iterator[Step]:
        """Every window until `duration_s` (whole windows; None: until the arrivals run out,
        the window holding the last arrival included); idle stretches as one step each."""
        window_s = self.fleet.window_s
        windows = None if duration_s is None else int(duration_s // window_s)
        k, quiet = 0, 0
        while windows is None or k < windows:
            start_s, end_s = k * window_s, (k + 1) * window_s
            chunk = arrivals.until(end_s)
            for run in self._running:
                run.sim.add_requests(chunk)
            offered = arrivals.offered_rps(start_s, end_s)
            before = [run.last for run in self._running]
            done = tuple(self._window(run, start_s, end_s) for run in self._running)
            self.windows_stepped += 1
            yield Step(k, start_s, end_s, offered, len(chunk), done,
                       int(chunk.input_tokens.sum()), int(chunk.output_tokens.sum()))
            k += 1
            if windows is None and arrivals.exhausted:
                return
            rest = len(chunk) == 0 and all(
                run.at_rest(prev) for run, prev in zip(self._running, before, strict=True))
            if self._vote is not None:
                rest = self._vote(rest)
            quiet = quiet + 1 if rest else 0
            skip_to = self._skip_to(arrivals, k, windows, quiet)
            if skip_to is not None:
                yield self._stretch(arrivals, k, skip_to)
                k = skip_to

    def _skip_to(
        self, arrivals: ArrivalSource, k: int, windows: int | None, quiet: int
    ) -> int | None:
        """The window to resume stepping at after an idle stretch from window `k`, or None."""
        rest = self.rest_windows
        if rest is None or quiet < rest:
            return None
        # A source written before `next_arrival_s` existed is stepped through, as a profile.
        ask = getattr(arrivals, "next_arrival_s", None)
        next_s = None if ask is None else ask()
        if next_s is None or not math.isfinite(next_s):
            return None
        holding = max(math.ceil(next_s / self.fleet.window_s) - 1, k)  # (start, end] windows
        stop = holding - rest
        if windows is not None:
            stop = min(stop, windows)
        return stop if stop - k >= 2 else None

    def _stretch(self, arrivals: ArrivalSource, first: int, stop: int) -> Step:
        """Windows first..stop-1 at rest as one step: each fleet moved to the stretch's end in
        O(1) (nothing is pending), each arm's rest window repeated."""
        start_s, end_s = first * self.fleet.window_s, stop * self.fleet.window_s
        chunk = arrivals.until(end_s)
        assert len(chunk) == 0, "an idle stretch holds no arrival"
        arms = []
        for run in self._running:
            run.sim.advance(end_s)
            assert run.last is not None
            arms.append(replace(run.last, start_s=start_s, end_s=end_s, records=()))
        return Step(first, start_s, end_s, arrivals.offered_rps(start_s, end_s), 0,
                    tuple(arms), windows=stop - first)

    def _window(self, run: _Running, start_s: float, end_s: float) -> ArmWindow:
        sim, arm = run.sim, run.arm
        steps = int(round(self.fleet.window_s / self.fleet.sample_s))
        times = [start_s + j * self.fleet.sample_s for j in range(1, steps + 1)]
        if isinstance(sim, CompiledFleet):
            samples = sim.advance_sampled(times)  # the window in one compiled call
        else:
            samples = []
            for time_s in times:
                sim.advance(time_s)
                samples.append(sim.replica_status())
        records: Sequence[IterationRecord] = sim.drain_records()
        view = arm.observer.observe(sim, records, start_s, end_s, run.status, samples)
        run.status = samples[-1]
        proposal = arm.policy.decide(view, end_s, run.provisioned)
        desired = arm.scaler.scale(end_s, run.provisioned, proposal)
        out = ArmWindow(
            arm=arm.policy.name,
            start_s=start_s,
            end_s=end_s,
            provisioned=run.provisioned,
            desired=desired,
            proposal=proposal,
            view=view,
            records=records,
            sim=sim,
        )
        sim.set_replicas(desired)
        run.provisioned = desired
        run.last = out
        return out
