"""Per-pod vLLM samples from a scrape of /metrics or from Prometheus. collector-spec §5, §10.

Both sources return a `SourceRead` of `PodSample`s at one instant, so a single observation
builder (`observations.py`) turns two reads into a window. A pod that cannot be read is a
`PodFailure` in the read, never an exception; a source that cannot be read at all (name
resolution, a failed Prometheus query) raises a `SourceError`: the daemon counts and logs it,
the deployment has no observation this cycle, and its calibration is kept.
"""

from __future__ import annotations

import logging
import math
import re
import socket
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol, runtime_checkable
from urllib.parse import urlsplit, urlunsplit

from exporter.base.clock import Clock
from exporter.base.errors import FailureReason, ScrapeError, SourceError
from exporter.collector.http_fetch import FetchError, fetch
from exporter.collector.prom_batch import PrometheusBatch
from exporter.collector.promapi import PrometheusClient, VectorSample
from exporter.collector.vllm_metrics import (
    PROCESS_START_METRIC,
    PodSample,
    RawSeries,
    SampleStatus,
    parse_exposition,
    sample_from_series,
    wanted_sample_names,
)
from exporter.config.values import DEFAULT_MAX_RESPONSE_BYTES

logger = logging.getLogger(__name__)

DEFAULT_SCRAPE_TIMEOUT_S = 5.0
DEFAULT_MAX_WORKERS = 8
DEFAULT_POD_LABEL = "pod"
DEFAULT_MAX_SAMPLE_AGE_S = 120.0
FUTURE_TOLERANCE_S = 5.0  # scrape times later than the query's by more: a warning


@dataclass(frozen=True, slots=True)
class PodFailure:
    """A pod (or URL) that could not be read this cycle, with a machine-readable reason."""

    pod: str
    reason: FailureReason
    message: str


@dataclass(frozen=True, slots=True)
class SourceRead:
    """Per-pod samples of one deployment at `time_s` (s, the source's time base)."""

    time_s: float
    samples: tuple[PodSample, ...]
    failures: tuple[PodFailure, ...] = ()


class Source(Protocol):
    """Reads every pod of one deployment once."""

    def read(self) -> SourceRead: ...


@runtime_checkable
class HistorySource(Protocol):
    """A source that can also read the past (Prometheus): the daemon's first cycle then has a
    whole window instead of a first read."""

    def read(self) -> SourceRead: ...

    def read_at(self, time_s: float) -> SourceRead: ...


Resolver = Callable[[str, int], list[str]]


def resolve_a_records(host: str, port: int) -> list[str]:
    """The IPv4 addresses of `host` (a headless Service name gives one per ready pod)."""
    infos = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


class ScrapeSource:
    """Fetches vLLM /metrics URLs concurrently and parses each pod whole or not at all."""

    def __init__(
        self,
        *,
        clock: Clock,
        urls: Sequence[str] = (),
        service_url: str | None = None,
        model_name: str | None = None,
        timeout_s: float = DEFAULT_SCRAPE_TIMEOUT_S,
        max_body_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        max_workers: int = DEFAULT_MAX_WORKERS,
        resolver: Resolver = resolve_a_records,
    ) -> None:
        if bool(urls) == (service_url is not None):
            raise ValueError(
                "give exactly one of `urls` (static targets) or `service_url` (headless Service), "
                f"got urls={list(urls)!r}, service_url={service_url!r}"
            )
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"`timeout_s` must be a finite number > 0, got {timeout_s}")
        if max_workers < 1:
            raise ValueError(f"`max_workers` must be an integer >= 1, got {max_workers}")
        self._clock = clock
        self._urls = tuple(urls)
        self._service_url = service_url
        self._model_name = model_name
        self._timeout_s = timeout_s  # the whole request, body included
        self._max_body_bytes = max_body_bytes
        self._max_workers = max_workers
        self._resolver = resolver
        # Each failing URL's reason: a failure is a WARNING when it starts or changes reason,
        # DEBUG while it repeats, and its end an INFO line (the counter counts every one).
        self._failing: dict[str, FailureReason] = {}

    def targets(self) -> tuple[str, ...]:
        """This cycle's URLs: the static list, or one per A record of the Service name."""
        if self._service_url is None:
            return self._urls
        parts = urlsplit(self._service_url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            addresses = self._resolver(host, port)
        except OSError as exc:
            raise ScrapeError(
                self._service_url, f"cannot resolve {host}: {exc}", reason=FailureReason.RESOLVE
            ) from exc
        return tuple(urlunsplit(parts._replace(netloc=f"{ip}:{port}")) for ip in addresses)

    def read(self) -> SourceRead:
        """Scrape every target once, concurrently; each failure is recorded, not raised."""
        time_s = self._clock.time()
        urls = self.targets()
        if not urls:
            return SourceRead(time_s=time_s, samples=())
        samples: list[PodSample] = []
        failures: list[PodFailure] = []
        with ThreadPoolExecutor(max_workers=min(self._max_workers, len(urls))) as pool:
            for url, outcome in zip(urls, pool.map(self._scrape_one, urls), strict=True):
                if isinstance(outcome, PodSample):
                    samples.append(outcome)
                    if self._failing.pop(url, None) is not None:
                        logger.info("scrape %s recovered", url)
                else:
                    self._note_failure(url, outcome)
                    failures.append(outcome)
        for url in self._failing.keys() - set(urls):
            del self._failing[url]  # a target gone from the Service is no longer failing
        return SourceRead(time_s=time_s, samples=tuple(samples), failures=tuple(failures))

    def _note_failure(self, url: str, failure: PodFailure) -> None:
        if self._failing.get(url) == failure.reason:
            logger.debug("scrape %s failed (%s): %s", url, failure.reason, failure.message)
            return
        self._failing[url] = failure.reason
        logger.warning(
            "scrape %s failed (%s): %s; repeats are logged at debug",
            url,
            failure.reason,
            failure.message,
        )

    def _scrape_one(self, url: str) -> PodSample | PodFailure:
        pod = pod_name_for_url(url)
        try:
            sent_s = self._clock.time()
            response = fetch(
                url,
                deadline_s=self._timeout_s,
                max_body_bytes=self._max_body_bytes,
                keep_line=is_read_line,
            )
            if response.status != 200:
                return PodFailure(pod, FailureReason.HTTP_STATUS, f"HTTP {response.status}")
            # The pod read its values somewhere between request and response: the midpoint
            # bounds the timestamp error by half the round trip, which grows under load.
            read_s = 0.5 * (sent_s + self._clock.time())
            text = response.body.decode("utf-8", errors="replace")
            sample = parse_exposition(text, pod=pod, time_s=read_s, model_name=self._model_name)
        except FetchError as exc:
            return PodFailure(pod, exc.reason, str(exc))
        except ScrapeError as exc:
            return PodFailure(pod, FailureReason.PARSE, str(exc))
        unreadable = _unreadable(sample)
        return sample if unreadable is None else PodFailure(pod, FailureReason.PARSE, unreadable)


def _unreadable(sample: PodSample) -> str | None:
    """Why a scraped answer is no vLLM sample at all (garbage, binary, empty, every value NaN):
    such a pod failed, and its load is estimated from the others', never dropped. A pod
    serving another model, or vLLM without a request counter yet, is a sample."""
    if sample.status is SampleStatus.NO_VLLM_METRICS:
        return f"no vLLM metric in the answer ({sample.skipped_lines} unparseable lines)"
    if sample.status is SampleStatus.INCOMPLETE and sample.rejected_samples:
        return f"no usable request counter ({sample.rejected_samples} NaN, negative or mistyped)"
    return None


# The lines the reader parses: vLLM's families in either spelling (`vllm:` or the escaped
# `vllm_`, and UTF-8 quoted names), their TYPE and HELP lines, and the process start time. The
# cycle's reader threads live as long as the daemon: one whole 32 MiB body read on such a
# thread kept about 23 MB of its malloc arena for good, so the body is streamed through the
# filter and never held whole (the response cap still counts every byte).
_READ_LINE_PREFIXES = tuple(
    f"{head}{name}".encode()
    for name in ("vllm", '{"vllm', PROCESS_START_METRIC)
    for head in ("", "# TYPE ", "# HELP ")
)


def is_read_line(line: bytes) -> bool:
    """A line of the exposition that the vLLM reader uses."""
    return line.startswith(_READ_LINE_PREFIXES)


def pod_name_for_url(url: str) -> str:
    """A scraped pod's identity: host:port, the same as Prometheus's `instance` label."""
    return urlsplit(url).netloc or url


def series_selector(selector: str) -> str:
    """The vLLM series `selector` (a deployment's `prometheus_selector`) matches."""
    # Plain identifiers ([a-z_:]), so the alternation needs no regex escaping.
    names = "|".join(sorted(wanted_sample_names(escaped=True)))
    extra = selector.strip().strip("{}").strip().strip(",")
    matchers = f'__name__=~"{names}"' + (f",{extra}" if extra else "")
    return "{" + matchers + "}"


class PrometheusSource:
    """Reads the raw vLLM series of one deployment from Prometheus at an instant."""

    def __init__(
        self,
        *,
        client: PrometheusClient,
        clock: Clock,
        selector: str = "",
        model_name: str | None = None,
        pod_label: str = DEFAULT_POD_LABEL,
        max_sample_age_s: float = DEFAULT_MAX_SAMPLE_AGE_S,
    ) -> None:
        if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", pod_label):
            raise ValueError(f"`pod_label` must be a Prometheus label name, got {pod_label!r}")
        if not (math.isfinite(max_sample_age_s) and max_sample_age_s > 0):
            raise ValueError(
                f"`max_sample_age_s` must be a finite number > 0, got {max_sample_age_s}"
            )
        self._client = client
        self._clock = clock
        self._model_name = model_name
        self._pod_label = pod_label
        self._max_sample_age_s = max_sample_age_s
        self.series_query = series_selector(selector)
        # Set by build_sources when one query reads every deployment (prom_batch.py).
        self.batch: tuple[PrometheusBatch, str] | None = None
        # Scrape times per pod. timestamp() drops the metric name, and Prometheus 2.x rejects a
        # result whose label sets then clash; a copy of the name in another label keeps them apart.
        named = f'label_replace({self.series_query}, "name_", "$1", "__name__", "(.+)")'
        self.timestamp_query = f"max by ({pod_label}) (timestamp({named}))"
        self._warned_future = False

    def read(self) -> SourceRead:
        """Raw series as of now (a batch's now: the query time of this cycle's batch)."""
        if self.batch is not None:
            batch, name = self.batch
            part = batch.part(name)
            return self._pods(part.values, part.stamps, part.time_s)
        return self.read_at(self._clock.time())

    def read_at(self, time_s: float) -> SourceRead:
        """Raw series as of unix time `time_s`; each pod's sample time is its scrape time."""
        if self.batch is not None:
            batch, name = self.batch
            part = batch.part(name, time_s)
            return self._pods(part.values, part.stamps, part.time_s)
        values = self._client.query(self.series_query, time_s=time_s)
        stamps = self._client.query(self.timestamp_query, time_s=time_s)
        return self._pods(values, stamps, time_s)

    def _pods(
        self, values: Sequence[VectorSample], stamps: Sequence[VectorSample], time_s: float
    ) -> SourceRead:
        by_pod: dict[str, list[RawSeries]] = {}
        for sample in values:
            pod = sample.labels.get(self._pod_label, "")
            if pod:  # a series without the pod label cannot be attributed (collector-spec §5)
                name = sample.labels.get("__name__", "")
                by_pod.setdefault(pod, []).append(RawSeries(name, sample.labels, sample.value))
        scraped_at = _latest_by_pod(stamps, self._pod_label)
        samples: list[PodSample] = []
        failures: list[PodFailure] = []
        for pod in sorted(by_pod):
            duplicated = _duplicated(by_pod[pod])
            if duplicated is not None:
                failures.append(PodFailure(pod, FailureReason.BAD_RESPONSE, duplicated))
                continue
            pod_time_s = self._scrape_time(scraped_at.get(pod, time_s), time_s)
            if time_s - pod_time_s > self._max_sample_age_s:
                # Lookback returns a dead pod's last values for minutes; do not read them as live.
                failures.append(
                    PodFailure(
                        pod, FailureReason.STALE, f"last scraped {time_s - pod_time_s:.0f} s ago"
                    )
                )
                continue
            samples.append(
                sample_from_series(
                    by_pod[pod], pod=pod, time_s=pod_time_s, model_name=self._model_name
                )
            )
        return SourceRead(time_s=time_s, samples=tuple(samples), failures=tuple(failures))

    def _scrape_time(self, scraped_s: float, query_s: float) -> float:
        """A scrape time after the query's (a clock ahead of the sizer's): the query's, since
        no sample can postdate it, warned once per source."""
        if scraped_s <= query_s:
            return scraped_s
        if scraped_s - query_s > FUTURE_TOLERANCE_S and not self._warned_future:
            self._warned_future = True
            logger.warning(
                "prometheus: scrape timestamps %.0f s in the future of the query time (a clock "
                "ahead of the sizer's?): read as taken at the query time",
                scraped_s - query_s,
            )
        return query_s


# Labels vLLM itself puts on its series: two series of one pod and name that agree on these
# come from two scrapes of the pod (a second job, a second ServiceMonitor).
_VLLM_LABELS = ("model_name", "engine", "finished_reason", "le")


def _duplicated(series: Sequence[RawSeries]) -> str | None:
    """Why a pod's series cannot be summed (two series for one metric), naming the labels they
    differ in; None when every metric has one series."""
    groups: dict[tuple[str, tuple[str, ...]], list[RawSeries]] = {}
    for raw in series:
        key = (raw.name, tuple(raw.labels.get(k, "") for k in _VLLM_LABELS))
        groups.setdefault(key, []).append(raw)
    for (name, _), same in sorted(groups.items()):
        if len(same) > 1:
            names = sorted({k for raw in same for k in raw.labels} - {"__name__"})
            differ = [k for k in names if len({raw.labels.get(k) for raw in same}) > 1]
            shown = ", ".join(
                f"{k}=" + "/".join(sorted(repr(raw.labels.get(k, "")) for raw in same))
                for k in differ
            )
            return (
                f"{len(same)} series for {name} of one pod, differing in {shown}: narrow the "
                "source's selector to one of them (a second scrape job?)"
            )
    return None


def _latest_by_pod(stamps: Sequence[VectorSample], pod_label: str) -> Mapping[str, float]:
    latest: dict[str, float] = {}
    for sample in stamps:
        pod = sample.labels.get(pod_label, "")
        if pod and math.isfinite(sample.value):
            latest[pod] = max(latest.get(pod, -math.inf), sample.value)
    return latest


__all__ = [
    "PodFailure",
    "PrometheusSource",
    "ScrapeSource",
    "Source",
    "SourceError",
    "SourceRead",
    "pod_name_for_url",
    "resolve_a_records",
]
