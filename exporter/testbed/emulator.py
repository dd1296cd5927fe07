"""Emulated vLLM replicas: the fleet simulator run in real time, each replica behind its own
vLLM-compatible /metrics on 127.0.0.1. Style §6; ecosystem §1; collector-spec §4.

    fleet = EmulatedFleet(
        ServiceParams(6.68, 2.01e-2, 5.52e-5), ServerConfig(),
        rng=np.random.default_rng(0),
        arrivals=5.0,                                  # req/s, or a RateProfile (t = 0 at start)
        input_lengths=LengthDist("uniform", 1024), output_lengths=LengthDist("uniform", 512),
        model_name="llama", replicas=2, time_scale=10.0, startup_delay_s=60.0,
        router=Router.LEAST_LOADED,
    )
    with fleet:                        # start() ... stop()
        fleet.urls                     # ["http://127.0.0.1:PORT/metrics", ...] of serving replicas
        fleet.set_rate_rps(8.0)        # or fleet.set_profile(RateProfile.paper(5.0))
        fleet.set_replicas(3)          # new ones serve after startup_delay_s; removed ones drain
        fleet.truth(t0_s, t1_s)        # FleetTruth: the simulator's own figures for a window
        fleet.result()                 # SimResult: every request so far
        fleet.replica_status()         # [ReplicaStatus]: state, running, waiting, KV tokens
        fleet.stats()                  # EmulatorStats: ticks, late ticks, slowest tick
        fleet.sim_clock                # a Clock that reads simulated time

Time. Simulated seconds = `time_scale` x seconds of the injected clock since `start()`.
Latency histograms hold simulated seconds, and counters advance per simulated second, so a
scraper that measures rates against wall time sees them `time_scale` times larger; give it
`sim_clock` (whose `time()` and `monotonic()` are simulated) to measure in simulated time.
`FleetTruth` windows are in simulated seconds on `sim_clock.monotonic()`'s axis.

Threads. `start()` runs a simulation thread that every `tick_s` advances the simulator to the
clock's simulated "now" and feeds the per-replica metric collectors; HTTP handler threads read
those collectors under their own locks, so scrapes never wait on a simulation step. A tick that
takes longer than `tick_s` is counted (`stats().behind_ticks`) and logged, and the next tick
catches up; the emulator keeps running. With `start(background=False)` nothing runs by itself:
tests advance a `ManualClock` and call `sync()`.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import numpy as np
from numpy.typing import NDArray

from exporter.base.clock import Clock, SystemClock
from exporter.testbed.emulator_endpoint import ReplicaEndpoint
from exporter.testbed.emulator_metrics import ReplicaMetrics
from model.queueing.params import ServerConfig, ServiceParams
from model.queueing.validation import require_int_at_least, require_non_negative, require_positive
from model.simulation.replica import ReplicaState
from model.simulation.simulator import ReplicaStatus, Router, SimResult, Simulator
from model.simulation.workloads import (
    ArrivalStream,
    LengthDist,
    LengthKind,
    LengthPairs,
    RateProfile,
    RequestTrace,
    cached_prefix_tokens,
)

logger = logging.getLogger(__name__)

DEFAULT_KV_CAPACITY_TOKENS = 449_200  # Llama-3.1-8B on one H100 (paper §IX)
DEFAULT_MAX_MODEL_LEN = 32_768
DEFAULT_TICK_S = 0.05
MAX_JUMP_S = 0.1  # simulated: decode runs are split so counters move smoothly
BEHIND_LOG_PERIOD_S = 10.0
_SERVING = (ReplicaState.READY, ReplicaState.DRAINING)


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetTruth:
    """The simulator's own account of a window (simulated s), as a perfect collector would
    measure it from vLLM's metrics: TTFT over first tokens in the window; token means and ITL
    (vLLM's per-request time per output token, 0 for one-token requests) over completions."""

    start_s: float
    end_s: float
    arrivals: int
    arrival_rate_rps: float
    completed: int
    throughput_rps: float
    mean_input_tokens: float
    mean_output_tokens: float
    mean_ttft_ms: float
    mean_itl_ms: float


@dataclass(frozen=True, slots=True, kw_only=True)
class EmulatorStats:
    """Health of the simulation thread."""

    ticks: int
    behind_ticks: int
    max_tick_s: float
    sim_time_s: float


class SimClock:
    """A Clock reading the emulator's simulated time."""

    def __init__(self, fleet: EmulatedFleet) -> None:
        self._fleet = fleet

    def time(self) -> float:
        return self._fleet.start_unix_s + self._fleet.sim_time_s

    def monotonic(self) -> float:
        return self._fleet.sim_time_s


class EmulatedFleet:
    """Simulated vLLM replicas served in real time; see the module docstring."""

    def __init__(
        self,
        params: ServiceParams,
        server: ServerConfig | None = None,
        *,
        rng: np.random.Generator,
        arrivals: RateProfile | float = 1.0,
        input_lengths: LengthDist | None = None,
        output_lengths: LengthDist | None = None,
        interarrival_cv: float = 1.0,
        pairs: LengthPairs | None = None,
        prefix_hit_share: float = 0.0,
        model_name: str = "emulated",
        replicas: int = 1,
        time_scale: float = 1.0,
        startup_delay_s: float = 0.0,
        router: Router = Router.LEAST_LOADED,
        kv_capacity_tokens: int = DEFAULT_KV_CAPACITY_TOKENS,
        max_model_len: int = DEFAULT_MAX_MODEL_LEN,
        clock: Clock | None = None,
        tick_s: float = DEFAULT_TICK_S,
        host: str = "127.0.0.1",
        base_port: int | None = None,
    ) -> None:
        self._time_scale = require_positive("time_scale", time_scale)
        self._tick_s = require_positive("tick_s", tick_s)
        self._kv_cap = require_int_at_least("kv_capacity_tokens", kv_capacity_tokens, 1)
        self._max_model_len = require_int_at_least("max_model_len", max_model_len, 1)
        if base_port is not None:
            require_int_at_least("base_port", base_port, 1)
        self._rng = rng
        self._in = input_lengths or LengthDist(LengthKind.UNIFORM, 1024)
        self._out = output_lengths or LengthDist(LengthKind.UNIFORM, 512)
        self._pairs = pairs  # recorded (prompt, output) pairs instead of the two laws
        cached_prefix_tokens(np.ones(1, dtype=np.int64), prefix_hit_share)  # checks the share
        self._prefix_hit_share = prefix_hit_share
        profile = arrivals if isinstance(arrivals, RateProfile) else RateProfile.constant(arrivals)
        self._stream = ArrivalStream(profile, rng, cv=require_non_negative("interarrival_cv",
                                                                           interarrival_cv))
        self._model_name = model_name
        self._clock: Clock = clock or SystemClock()
        self._host = host
        self._base_port = base_port
        self._sim = Simulator(
            params,
            server or ServerConfig(),
            replicas=replicas,
            router=router,
            kv_capacity_tokens=self._kv_cap,
            startup_delay_s=startup_delay_s,
            max_jump_s=MAX_JUMP_S,
            record_iterations=True,
        )
        self._lock = threading.RLock()  # the simulator, the stream and the served map
        self._served: dict[int, ReplicaEndpoint] = {}
        self._urls: tuple[str, ...] = ()
        self._reject_cursor = 0
        self._start_mono: float | None = None
        self.start_unix_s = 0.0
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._ticks = 0
        self._behind = 0
        self._max_tick_s = 0.0
        self._last_behind_log = -math.inf
        self.error: BaseException | None = None  # what stopped the simulation thread, if any

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self, *, background: bool = True) -> EmulatedFleet:
        """Start the clock and the initial replicas' servers (and the simulation thread)."""
        if self._start_mono is not None:
            raise RuntimeError("EmulatedFleet already started")
        self._start_mono = self._clock.monotonic()
        self.start_unix_s = self._clock.time()
        with self._lock:
            self._refresh_replicas()
        if background:
            self._thread = threading.Thread(target=self._loop, name="vllm-emulator", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the simulation thread and every HTTP server."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            for served in self._served.values():
                served.stop()
            self._urls = ()

    def __enter__(self) -> EmulatedFleet:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- control --------------------------------------------------------------------------------

    @property
    def urls(self) -> list[str]:
        """/metrics URLs of the replicas serving now (ready or draining)."""
        return list(self._urls)

    @property
    def sim_time_s(self) -> float:
        """Simulated seconds since start() (0 before)."""
        if self._start_mono is None:
            return 0.0
        return (self._clock.monotonic() - self._start_mono) * self._time_scale

    @property
    def sim_clock(self) -> SimClock:
        """A Clock in simulated time."""
        return SimClock(self)

    def sync(self) -> None:
        """Advance the simulation to the clock's simulated now and publish the metrics."""
        with self._lock:
            self._advance()

    def set_replicas(self, count: int) -> None:
        """Scale to `count` replicas from now."""
        with self._lock:
            self._advance()
            self._sim.set_replicas(count)
            self._refresh_replicas()

    def set_rate_rps(self, rate_rps: float) -> None:
        """Hold a constant arrival rate (req/s of simulated time) from now."""
        self.set_profile(RateProfile.constant(require_non_negative("rate_rps", rate_rps)))

    def set_profile(self, profile: RateProfile) -> None:
        """Follow `profile` from now (its t = 0 is now)."""
        with self._lock:
            self._advance()
            self._stream.set_profile(profile, self._stream.cursor_s)

    def result(self) -> SimResult:
        """Every request simulated so far."""
        with self._lock:
            return self._sim.result()

    def truth(self, start_s: float, end_s: float) -> FleetTruth:
        """The simulator's figures for the window (start_s, end_s] of simulated time."""
        if not end_s > start_s:
            raise ValueError(f"`end_s` must be > start_s ({start_s}), got {end_s}")
        res = self.result()
        span = end_s - start_s
        done = res.finished_between(start_s, end_s)
        with np.errstate(invalid="ignore"):
            firsts = (res.first_token_s > start_s) & (res.first_token_s <= end_s)
        itl = np.nan_to_num(res.itl_ms[done], nan=0.0)
        return FleetTruth(
            start_s=start_s,
            end_s=end_s,
            arrivals=int(np.count_nonzero(res.arrived_between(start_s, end_s))),
            arrival_rate_rps=float(np.count_nonzero(res.arrived_between(start_s, end_s))) / span,
            completed=int(np.count_nonzero(done)),
            throughput_rps=float(np.count_nonzero(done)) / span,
            mean_input_tokens=_mean(res.input_tokens[done]),
            mean_output_tokens=_mean(res.output_tokens[done]),
            mean_ttft_ms=_mean(res.ttft_ms[firsts]),
            mean_itl_ms=_mean(itl),
        )

    def replica_status(self) -> list[ReplicaStatus]:
        """Every replica ever created, by index, as of the last sync."""
        with self._lock:
            return self._sim.replica_status()

    def stats(self) -> EmulatorStats:
        """Tick counts, late ticks and the slowest tick (wall s)."""
        return EmulatorStats(
            ticks=self._ticks,
            behind_ticks=self._behind,
            max_tick_s=self._max_tick_s,
            sim_time_s=self.sim_time_s,
        )

    # -- simulation thread ----------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping.is_set():
            began = self._clock.monotonic()
            try:
                self.sync()
            except Exception as exc:  # a bug must not pass silently, nor kill the host process
                logger.exception("emulator simulation thread stopped")
                self.error = exc
                return
            spent = self._clock.monotonic() - began
            self._ticks += 1
            self._max_tick_s = max(self._max_tick_s, spent)
            if spent > self._tick_s:
                self._behind += 1
                if began - self._last_behind_log >= BEHIND_LOG_PERIOD_S:
                    self._last_behind_log = began
                    logger.warning(
                        "emulator behind real time: tick took %.3f s (period %.3f s); "
                        "%d late ticks so far", spent, self._tick_s, self._behind,
                    )
            self._stopping.wait(max(0.0, self._tick_s - spent))

    def _advance(self) -> None:
        target = self.sim_time_s
        if target <= self._sim.now_s:
            return
        times = self._stream.draw_until(target)
        if times.size:
            if self._pairs is None:
                n_in = self._in.sample(times.size, self._rng)
                n_out = self._out.sample(times.size, self._rng)
            else:
                n_in, n_out = self._pairs.sample(times.size, self._rng)
            cached = cached_prefix_tokens(n_in, self._prefix_hit_share)
            self._sim.add_requests(RequestTrace(times, n_in, n_out, cached))
        self._sim.run(target)
        requests = self._sim.requests
        for record in self._sim.drain_records():
            self._served_for(record.replica).metrics.apply(record, requests)
        end = requests.size
        rows = slice(self._reject_cursor, end)
        rejected = requests.replica[rows][requests.rejected[rows]]
        for index, count in zip(*np.unique(rejected[rejected >= 0], return_counts=True),
                                strict=True):
            self._served_for(int(index)).metrics.add_rejections(int(count))
        self._reject_cursor = end
        self._refresh_replicas()

    def _refresh_replicas(self) -> None:
        """Publish gauges; serve replicas that became ready, stop removed ones."""
        changed = False
        for status in self._sim.replica_status():
            served = self._served_for(status.index)
            served.metrics.set_gauges(
                running=status.running,
                waiting=status.waiting,
                kv_usage_ratio=status.kv_tokens / self._kv_cap,
            )
            if status.state in _SERVING and served.url is None:  # served once, never restarted
                port = 0 if self._base_port is None else self._base_port + status.index
                served.serve(self._host, port, f"emulated-replica-{status.index}")
                changed = True
            elif status.state is ReplicaState.REMOVED and served.serving:
                served.stop()
                changed = True
        if changed:
            self._urls = tuple(s.url for s in self._served.values() if s.serving and s.url)

    def _served_for(self, index: int) -> ReplicaEndpoint:
        served = self._served.get(index)
        if served is None:
            metrics = ReplicaMetrics(
                model_name=self._model_name,
                max_model_len=self._max_model_len,
                kv_capacity_tokens=self._kv_cap,
                created_s=self.start_unix_s + self._sim.now_s,
            )
            served = self._served[index] = ReplicaEndpoint(metrics)
        return served


def _mean(values: NDArray[Any]) -> float:
    return float(np.mean(values)) if values.size else math.nan
