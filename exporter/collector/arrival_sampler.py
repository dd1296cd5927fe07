"""Sidecar mode: sample the pod's own vLLM once a second and read the arrival CV and the prompt
tokens of each second. percentiles.md §2.

vLLM has no arrival counter; the TTFT histogram's `_count` ticks once per request, about one
TTFT after its arrival. Counted over 1 s bins, the index of dispersion I = Var / Mean of the
per-bin counts of a renewal process tends to the squared CV of its inter-arrival times, so
sqrt(I) over a 30 s window estimates the arrival CV (simulated: 0.82-1.18 for Poisson, 1.45-2.22
for gamma CV 2; the traffic tracker smooths it over 10 windows). Prometheus scrapes every
15-30 s cannot see this, so only a sidecar (a scrape source on loopback) samples it.

The same read takes the prompt-token counter (`vllm:prompt_tokens_total`): its increments per
second are the prompt tokens the pod took in that second, the stream a burst is measured on
(exporter.sizing.bursts: the tokens per 5 s, not the requests, are what a TTFT queues behind).
vLLM counts a prompt's tokens as it prefills them, so a burst the pod cannot prefill at once
reads spread over the seconds it took (never above the pod's prefill rate), the only per-second
count of prompt tokens vLLM exports.

The sampler runs on its own thread, one fetch per period with its own deadline (shorter than
the period), and never touches a cycle: the daemon asks it for a window's reading. A window with
a failed fetch or a missing sample (the pod went away) gives no CV and names the problem; so
does a counter that fell or a new process start time (a restart).
"""

from __future__ import annotations

import logging
import math
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

import numpy as np

from exporter.base.clock import Clock
from exporter.base.errors import ScrapeError
from exporter.collector.http_fetch import FetchError, fetch
from exporter.collector.pod_observation import PROCESS_START_TOLERANCE_S, Problem, same_process
from exporter.collector.vllm_metrics import (
    COUNTER_SOURCES,
    HISTOGRAM_SOURCES,
    PROCESS_START_METRIC,
    CounterName,
    HistogramName,
    escaped_name,
    parse_exposition,
)
from exporter.config.values import DEFAULT_MAX_RESPONSE_BYTES, DeploymentConfig

logger = logging.getLogger(__name__)

SAMPLE_PERIOD_S = 1.0
FETCH_DEADLINE_S = 0.5  # below the period: a slow fetch never delays the next one much
MAX_GAP_PERIODS = 1.5  # samples further apart than this many periods: the window has a gap
MIN_REQUESTS = 10  # fewer requests in a window: no CV (an idle window is not a problem)
KEEP_S = 2 * 3600.0  # samples kept, enough for the longest cycle period and its window
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
_COUNTER = HistogramName.TTFT_S


def is_loopback(url: str) -> bool:
    """True for a URL on this host: a sidecar's view of its own pod."""
    return (urlsplit(url).hostname or "") in LOOPBACK_HOSTS


@dataclass(frozen=True, slots=True)
class CounterSample:
    """One read of the per-request counter at `time_s` (s); count None: the read failed."""

    time_s: float
    count: float | None
    process_start_s: float | None = None
    prompt_tokens: float | None = None  # the prompt-token counter (None: not exported)


@dataclass(frozen=True, slots=True)
class DispersionReading:
    """A window's index of dispersion of per-period request counts and its request count;
    index None with a problem (or with too few requests)."""

    index: float | None
    requests: float
    problem: Problem | None = None


def index_of_dispersion(counts: np.ndarray) -> float | None:
    """Var / Mean of per-bin counts (sample variance); None without two bins or any count."""
    if counts.size < 2 or counts.mean() <= 0:
        return None
    return float(counts.var(ddof=1) / counts.mean())


def prompt_tokens_per_period(
    samples: list[CounterSample], start_s: float, end_s: float, period_s: float
) -> np.ndarray | None:
    """The prompt tokens taken in between consecutive samples over (start_s, end_s] (samples
    sorted by time); None when the window has a gap, a failed read, no prompt-token counter,
    a counter that fell or a restart (a problem `read_window` names)."""
    inside = [s for s in samples if start_s <= s.time_s <= end_s]
    times = [start_s] + [s.time_s for s in inside] + [end_s]
    if len(inside) < 2 or max(np.diff(times)) > MAX_GAP_PERIODS * period_s:
        return None
    if any(s.prompt_tokens is None for s in inside):
        return None
    starts = {s.process_start_s for s in inside if s.process_start_s is not None}
    if starts and max(starts) - min(starts) > PROCESS_START_TOLERANCE_S:
        return None
    increments = np.diff(np.array([s.prompt_tokens for s in inside], dtype=np.float64))
    return None if np.any(increments < 0) else increments


def read_window(
    samples: list[CounterSample], start_s: float, end_s: float, period_s: float
) -> DispersionReading:
    """The reading over (start_s, end_s] from the samples taken in it (sorted by time)."""
    inside = [s for s in samples if start_s <= s.time_s <= end_s]
    limit = MAX_GAP_PERIODS * period_s
    times = [start_s] + [s.time_s for s in inside] + [end_s]
    if len(inside) < 2 or max(np.diff(times)) > limit:
        return DispersionReading(None, 0.0, Problem.SAMPLER_GAP)
    if any(s.count is None for s in inside):
        return DispersionReading(None, 0.0, Problem.SAMPLER_GAP)
    starts = {s.process_start_s for s in inside if s.process_start_s is not None}
    counts = np.array([s.count for s in inside], dtype=np.float64)
    increments = np.diff(counts)
    restarted = bool(starts) and max(starts) - min(starts) > PROCESS_START_TOLERANCE_S
    if restarted or np.any(increments < 0):
        return DispersionReading(None, 0.0, Problem.COUNTER_RESET)
    requests = float(increments.sum())
    index = index_of_dispersion(increments) if requests >= MIN_REQUESTS else None
    return DispersionReading(index, requests)


class ArrivalSampler:
    """Samples one vLLM's per-request counter every `period_s` on its own thread."""

    def __init__(
        self,
        url: str,
        *,
        clock: Clock,
        model_name: str | None = None,
        period_s: float = SAMPLE_PERIOD_S,
        deadline_s: float = FETCH_DEADLINE_S,
        max_body_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        if not (math.isfinite(period_s) and period_s > 0):
            raise ValueError(f"`period_s` must be a finite number > 0, got {period_s}")
        if not (math.isfinite(deadline_s) and 0 < deadline_s <= period_s):
            raise ValueError(f"`deadline_s` must be > 0 and <= period_s, got {deadline_s}")
        self.url = url
        self.period_s = period_s
        self._clock = clock
        self._model_name = model_name
        self._deadline_s = deadline_s
        self._max_body_bytes = max_body_bytes
        self._lock = threading.Lock()
        self._samples: deque[CounterSample] = deque(maxlen=int(KEEP_S / period_s) + 1)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False  # log a run of failures once

    def sample_once(self) -> CounterSample:
        """Fetch and record one sample now (the thread's step; tests call it directly)."""
        time_s = self._clock.time()
        outcome = self._read(time_s)
        if isinstance(outcome, str):
            if not self._failing:  # once per run of failures
                logger.warning("arrival sampler: %s: %s", self.url, outcome)
            self._failing = True
            sample = CounterSample(time_s, None)
        else:
            self._failing = False
            sample = outcome
        with self._lock:
            self._samples.append(sample)
        return sample

    def _read(self, time_s: float) -> CounterSample | str:
        """The counter now, or why it could not be read."""
        try:
            response = fetch(
                self.url,
                deadline_s=self._deadline_s,
                max_body_bytes=self._max_body_bytes,
                keep_line=_is_counter_line,
            )
        except FetchError as exc:
            return str(exc)
        if response.status != 200:
            return f"HTTP {response.status}"
        text = response.body.decode("utf-8", errors="replace")
        try:
            pod = parse_exposition(text, pod=self.url, time_s=time_s, model_name=self._model_name)
        except ScrapeError as exc:
            return str(exc)
        totals = pod.histograms.get(_COUNTER) if pod.ok else None
        if totals is None:
            return f"no {_COUNTER.value} count for the model ({pod.status})"
        prompt = pod.counters.get(CounterName.PROMPT_TOKENS)
        return CounterSample(time_s, totals.count, pod.process_start_s, prompt)

    def fell(self, start_s: float, end_s: float) -> bool:
        """True when the counter fell within (start_s, end_s] (s) while the process start time
        stayed: the URL answers for more than one process (exporter.collector.counter_trust)."""
        with self._lock:
            inside = [
                (s.count, s.process_start_s)
                for s in self._samples
                if s.count is not None and start_s <= s.time_s <= end_s
            ]
        return any(
            b < a and same_process(start_a, start_b)
            for (a, start_a), (b, start_b) in zip(inside, inside[1:], strict=False)
        )

    def reading(self, start_s: float, end_s: float) -> DispersionReading:
        """The reading over the window (start_s, end_s] (s, the clock's time())."""
        with self._lock:
            samples = list(self._samples)
        return read_window(samples, start_s, end_s, self.period_s)

    def prompt_tokens(self, start_s: float, end_s: float) -> np.ndarray | None:
        """The prompt tokens taken in each period of the window (start_s, end_s] (s, the
        clock's time()); None without a clean series (`prompt_tokens_per_period`)."""
        with self._lock:
            samples = list(self._samples)
        return prompt_tokens_per_period(samples, start_s, end_s, self.period_s)

    def start(self) -> None:
        """Run `sample_once` every period on a daemon thread until `stop`."""
        if self._thread is not None:
            raise RuntimeError("ArrivalSampler already started")
        self._thread = threading.Thread(
            target=self._run, name="vllm-sizer-arrival-sampler", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (a fetch in flight ends by its deadline)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self._deadline_s + self.period_s)

    def _run(self) -> None:
        next_s = self._clock.monotonic()
        while not self._stop.is_set():
            self.sample_once()
            next_s += self.period_s
            now_s = self._clock.monotonic()
            if next_s < now_s:  # fell behind (a slow fetch): skip, never burst to catch up
                next_s = now_s + self.period_s
            self._stop.wait(next_s - now_s)


# The lines the sampler needs: its counter's histogram, the required request counter, the
# prompt-token counter and the process start time. Parsing only these (before the prompt-token
# counter) took 0.8 ms instead of the whole exposition's 36 ms (629 lines of vLLM 0.32,
# measured under load), once a second; and the sampler's thread, which lives as long as the
# daemon, never holds a whole body (a 32 MiB one grew its malloc arena by about 30 MB for good).
_FAMILIES = (
    *HISTOGRAM_SOURCES[_COUNTER],
    *(name.removesuffix("_total") for name in COUNTER_SOURCES[CounterName.REQUEST_SUCCESS]),
    *(name.removesuffix("_total") for name in COUNTER_SOURCES[CounterName.PROMPT_TOKENS]),
    PROCESS_START_METRIC,
)
_PREFIXES = tuple(
    f"{head}{spelling}{suffix}{end}".encode()
    for family in _FAMILIES
    for spelling in {family, escaped_name(family)}
    for suffix in ("", "_sum", "_count", "_total")
    for head, end in (("", "{"), ("", " "), ("# TYPE ", " "))
)


def _is_counter_line(line: bytes) -> bool:
    """A sample of the counter or the process start time, or one of their TYPE lines."""
    return line.startswith(_PREFIXES)


def build_samplers(
    deployments: Iterable[DeploymentConfig],
    clock: Clock,
    max_body_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
) -> dict[str, ArrivalSampler]:
    """An arrival sampler per deployment read in sidecar mode: one scrape URL on loopback;
    `max_body_bytes` is the configured response cap (`max_response_mib`)."""
    return {
        dep.name: ArrivalSampler(
            dep.source.scrape_urls[0],
            clock=clock,
            model_name=dep.model_name,
            max_body_bytes=max_body_bytes,
        )
        for dep in deployments
        if len(dep.source.scrape_urls) == 1 and is_loopback(dep.source.scrape_urls[0])
    }
