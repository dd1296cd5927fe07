"""The production observation path over a simulated fleet: each replica's iterations feed the
emulator's vLLM exposition (exporter/testbed/emulator_metrics.py), and at each window's end
every serving replica's /metrics text is filtered and parsed by the collector's own code
(`is_read_line`, `parse_exposition`) and closed into a window by its `WindowTracker`, histograms
included. So what a policy reads carries the collector's own errors: histogram means, the
first window of a new pod, a draining pod's last reads. Only HTTP is left out.

Rendering and parsing the text was a third of a replay's time (issue 45), and the round trip
is exact: the pods' samples are built from the emulator's values instead
(exporter/replay/pod_values.py), and every `text_every`-th read still goes through the text and
must give the same sample, value for value (a difference stops the replay).

`PerfectObserver` is the other observer: the simulator's own figures (exporter/replay/perfect.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest

from exporter.collector.observations import WindowTracker
from exporter.collector.sources import SourceRead
from exporter.collector.vllm_metrics import (
    CounterName,
    GaugeName,
    PodSample,
    parse_exposition,
    wanted_sample_names,
)
from exporter.replay.perfect import WindowView, observe_window, prompt_tokens_per_period
from exporter.replay.pod_values import pod_values
from exporter.testbed.emulator import DEFAULT_MAX_MODEL_LEN
from exporter.testbed.emulator_metrics import ReplicaMetrics
from model.queueing.validation import require_int_at_least
from model.simulation.compiled_fleet import Fleet
from model.simulation.records import WindowRecords
from model.simulation.replica import IterationRecord, ReplicaState
from model.simulation.simulator import ReplicaStatus

# Every so many pod reads, the text path too, checked against the values (the first read is).
TEXT_EVERY = 100
_SERVING = (ReplicaState.READY, ReplicaState.DRAINING)  # what answers /metrics (as the emulator)
# The reader keeps only these samples (and checks their family's TYPE); the other samples are
# left out of the rendered text and HELP lines dropped before parsing: the same PodSample in a
# third of the rendering and parsing time.
_SAMPLES = frozenset(n.encode() for n in wanted_sample_names())
_FAMILIES = frozenset(
    n.removesuffix(end) for n in _SAMPLES for end in (b"_total", b"_sum", b"_count", b"_bucket")
)


class PerfectObserver:
    """The simulator's own account of each window (exporter/replay/perfect.py)."""

    def __init__(
        self,
        *,
        kv_capacity_tokens: float,
        max_model_len: int = DEFAULT_MAX_MODEL_LEN,
        deployment: str = "sim",
    ) -> None:
        self._kv = kv_capacity_tokens
        self._max_model_len = max_model_len
        self._deployment = deployment

    def observe(
        self,
        sim: Fleet,
        records: Sequence[IterationRecord],
        start_s: float,
        end_s: float,
        start_status: Sequence[ReplicaStatus],
        samples: Sequence[Sequence[ReplicaStatus]],
    ) -> WindowView:
        return observe_window(
            sim.result(),
            start_s,
            end_s,
            start_status,
            samples,
            records=records,
            kv_capacity_tokens=self._kv,
            max_model_len=self._max_model_len,
            deployment=self._deployment,
        )


class _Replica:
    """One replica's metrics and the registry its exposition is rendered from (only the
    samples the reader keeps: formatting the others is most of the rendering time)."""

    def __init__(self, metrics: ReplicaMetrics) -> None:
        self.metrics = metrics
        registry = CollectorRegistry(auto_describe=True)
        registry.register(metrics)
        self.registry = registry.restricted_registry(n.decode() for n in _SAMPLES)


class ExpositionObserver:
    """Each window read through the emulated exposition and the collector's parser."""

    def __init__(
        self,
        *,
        model_name: str,
        kv_capacity_tokens: int,
        max_model_len: int = DEFAULT_MAX_MODEL_LEN,
        deployment: str = "sim",
        values: bool = True,
        text_every: int | None = TEXT_EVERY,
    ) -> None:
        """`values`: read each pod's figures as values (exporter/replay/pod_values.py) and
        the text only every `text_every`-th read, to check them (None: never); False: every
        read through the text, as a scrape."""
        if text_every is not None:
            require_int_at_least("text_every", text_every, 1)
        self._values = values
        self._text_every = text_every
        self._reads = 0
        self._model_name = model_name
        self._kv = kv_capacity_tokens
        self._max_model_len = max_model_len
        self._tracker = WindowTracker(deployment)
        self._replicas: dict[int, _Replica] = {}
        self._reject_cursor = 0
        self._generated: dict[str, float] = {}  # each pod's generation-token counter, last read

    def observe(
        self,
        sim: Fleet,
        records: Sequence[IterationRecord],
        start_s: float,
        end_s: float,
        start_status: Sequence[ReplicaStatus],
        samples: Sequence[Sequence[ReplicaStatus]],
    ) -> WindowView:
        requests = sim.requests
        cols = WindowRecords.of(records)
        for index in dict.fromkeys(cols.replica.tolist()):  # in order of first record
            own = cols if cols.replica[0] == cols.replica[-1] else cols.select(
                cols.replica == index)
            self._replica(index, start_s).metrics.apply_all(own, requests)
        # Every row of the table has arrived by now (the engine offers a window's arrivals
        # before running it), so the refused ones can be counted up to the end.
        rows = slice(self._reject_cursor, requests.size)
        refused = requests.replica[rows][requests.rejected[rows]]
        for index, count in zip(*np.unique(refused[refused >= 0], return_counts=True),
                                strict=True):
            self._replica(int(index), start_s).metrics.add_rejections(int(count))
        self._reject_cursor = requests.size
        end = samples[-1]
        pods: list[PodSample] = []
        for status in end:
            replica = self._replica(status.index, start_s)
            replica.metrics.set_gauges(
                running=status.running,
                waiting=status.waiting,
                kv_usage_ratio=status.kv_tokens / self._kv,
            )
            if status.state in _SERVING:
                pods.append(self._read(status.index, replica, end_s))
        obs = self._tracker.observe(SourceRead(time_s=end_s, samples=tuple(pods)))
        kv = [p.gauges[GaugeName.KV_USAGE] for p in pods if GaugeName.KV_USAGE in p.gauges]
        waiting = sum(p.gauges.get(GaugeName.WAITING, 0.0) for p in pods)
        size = requests.size
        return WindowView(
            prompt_tokens=prompt_tokens_per_period(
                requests.arrival_s[:size], requests.input_tokens[:size], start_s, end_s,
                len(samples),
            ),
            observation=obs,
            kv_usage_ratio=float(np.mean(kv)) if kv else 0.0,
            max_kv_usage_ratio=max(kv) if kv else 0.0,
            waiting_requests=int(waiting),
            generated_tokens_rps=self._generated_rps(pods, end_s - start_s),
            peak_waiting=max(sum(s.waiting for s in sample) for sample in samples),
            replica_starting=any(
                s.state is ReplicaState.STARTING for sample in (start_status, *samples)
                for s in sample
            ),
        )

    def _replica(self, index: int, now_s: float) -> _Replica:
        replica = self._replicas.get(index)
        if replica is None:
            replica = self._replicas[index] = _Replica(
                ReplicaMetrics(
                    model_name=self._model_name,
                    max_model_len=self._max_model_len,
                    kv_capacity_tokens=self._kv,
                    created_s=now_s,
                )
            )
        return replica

    def _read(self, index: int, replica: _Replica, time_s: float) -> PodSample:
        """The pod's sample: as values, and through the text on every `text_every`-th read
        (then both must agree, value for value)."""
        pod = f"replica-{index}"
        self._reads += 1
        sample = None
        if self._values:
            sample = pod_values(replica.metrics, pod=pod, time_s=time_s,
                                model_name=self._model_name)
        if sample is not None and (self._text_every is None
                                   or (self._reads - 1) % self._text_every):
            return sample
        text = self._read_text(index, replica, time_s)
        if sample is not None and sample != text:
            raise RuntimeError(f"{pod} at {time_s:g} s: the values read {sample} but the "
                                 f"exposition text {text}")
        return text

    def _read_text(self, index: int, replica: _Replica, time_s: float) -> PodSample:
        """The pod's /metrics, the lines the reader uses, parsed by the reader."""
        body = generate_latest(replica.registry)
        kept = b"\n".join(line for line in body.split(b"\n") if _used(line))
        return parse_exposition(
            kept.decode() + "\n", pod=f"replica-{index}", time_s=time_s,
            model_name=self._model_name,
        )  # fmt: skip

    def _generated_rps(self, pods: Sequence[PodSample], window_s: float) -> float:
        """Output tokens/s over the window, from the pods' generation-token counters (a pod's
        first read has no increase yet)."""
        total = 0.0
        now = {p.pod: p.counters.get(CounterName.GENERATION_TOKENS) for p in pods}
        for pod, value in now.items():
            before = self._generated.get(pod)
            if value is not None and before is not None and value >= before:
                total += value - before
        self._generated = {pod: v for pod, v in now.items() if v is not None}
        return total / window_s


def _used(line: bytes) -> bool:
    """A sample line the reader keeps, or the TYPE line of its family."""
    if line.startswith(b"# TYPE "):
        return line.split(b" ", 3)[2] in _FAMILIES
    return line.split(b"{", 1)[0].split(b" ", 1)[0] in _SAMPLES
