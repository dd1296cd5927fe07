"""The soak's timed fault phases against healthy deployments: a connection flood at the daemon's
port, a garbage pod in a healthy fleet, and a Prometheus answering two series per pod.

- Flood: FLOOD_CLIENTS clients connect, send nothing and reconnect as soon as the daemon lets
  go (five times its connection limit over the 40 idle ones); a prober asks /healthz once a
  second meanwhile, and every answer must be a 200 within PROBE_TIMEOUT_S.
- Garbage: one pod of a healthy two-replica fleet is read through a proxy that, in the phase,
  answers binary garbage instead of the pod's metrics; the deployment must keep its count.
- Duplicate series: a deployment reads a healthy fleet through a fake Prometheus that, in the
  phase, returns each series twice, the copy from a second scrape job with counters above 1e15;
  the deployment must keep its count (no window at 1e15 req/s).
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from contextlib import suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs
from urllib.request import urlopen

from prometheus_client.parser import text_string_to_metric_families

from exporter.collector.prom_batch import TAG_LABEL
from exporter.collector.vllm_metrics import wanted_sample_names
from tests.reliability.fault_server import Fault, FaultServer

FLOOD_CLIENTS = 80
PROBE_TIMEOUT_S = 2.0
# Each phase's (start, end) as a share of the soak: after the warm-up (the first quarter),
# one at a time, and none in the last minute of a 10-minute soak, which the growth checks
# compare with the first.
PHASES = {"flood": (0.30, 0.45), "garbage": (0.50, 0.65), "duplicate": (0.70, 0.85)}
GARBAGE = bytes(range(256)).decode("latin-1") * 8
DUPLICATE_OFFSET = 1e15


def active(phase: str, elapsed_s: float, duration_s: float) -> bool:
    start, end = PHASES[phase]
    return start * duration_s <= elapsed_s < end * duration_s


class ConnectionFlood:
    """FLOOD_CLIENTS reconnecting idle clients and a /healthz prober, while started."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.probes: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def running(self) -> bool:
        return bool(self._threads)

    def start(self) -> None:
        self._stop.clear()
        self._threads = [
            threading.Thread(target=self._reconnect, daemon=True) for _ in range(FLOOD_CLIENTS)
        ]
        self._threads.append(threading.Thread(target=self._probe, daemon=True))
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads = []

    def _reconnect(self) -> None:
        while not self._stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as sock:
                    while not self._stop.is_set():
                        with suppress(TimeoutError):
                            if sock.recv(1024) == b"":
                                break
            except OSError:
                self._stop.wait(0.01)

    def _probe(self) -> None:
        while not self._stop.wait(1.0):
            start = time.monotonic()
            try:
                url = f"http://127.0.0.1:{self.port}/healthz"
                with urlopen(url, timeout=PROBE_TIMEOUT_S) as resp:
                    status: int | str = resp.status
            except OSError as exc:  # HTTPError (a 503) included
                status = getattr(exc, "code", None) or type(exc).__name__
            self.probes.append({"status": status, "s": round(time.monotonic() - start, 3)})


class GarbageProxy:
    """A pod's /metrics as read through a proxy that answers garbage while `garbage` is set."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.garbage = False
        self.server = FaultServer(Fault.SERVE, self._body, max_seconds=10.0)
        self.url = self.server.url

    def _body(self) -> str:
        if self.garbage:
            return GARBAGE
        with urlopen(self.upstream, timeout=2.0) as resp:
            return str(resp.read().decode())


class DuplicatingPrometheus:
    """A fake Prometheus over a fleet's /metrics URLs (pod `pod-k` for the k-th URL); while
    `duplicate` is set, every series comes twice, the copy from job `vllm-copy` at +1e15."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.duplicate = False
        self.queries = 0
        wanted = wanted_sample_names()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                length = int(self.headers.get("Content-Length", "0"))
                form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
                fake.queries += 1
                time_s = float(form.get("time", time.time()))
                # The daemon reads its Prometheus deployments in one batch, each series tagged
                # with its deployment's name (exporter/collector/prom_batch.py): so are these.
                names = re.findall(rf'"{TAG_LABEL}", "([^"]+)"', form["query"])
                tag: dict[str, str] = {TAG_LABEL: str(names[0])} if names else {}
                if form["query"].startswith("max by ("):
                    result = [
                        {"metric": {"pod": f"pod-{k}", **tag}, "value": [time_s, repr(time_s)]}
                        for k in range(len(fake.urls))
                    ]
                else:
                    result = fake.series(time_s, wanted, tag)
                body = json.dumps(
                    {"status": "success", "data": {"resultType": "vector", "result": result}}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def series(
        self, time_s: float, wanted: frozenset[str], tag: dict[str, str] | None = None
    ) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for k, url in enumerate(self.urls):
            with urlopen(url, timeout=2.0) as resp:
                text = resp.read().decode()
            for family in text_string_to_metric_families(text):
                for s in family.samples:
                    if s.name not in wanted:
                        continue
                    labels = {**s.labels, "__name__": s.name, "pod": f"pod-{k}",
                              "namespace": "soak", **(tag or {})}  # fmt: skip
                    out.append({"metric": {**labels, "job": "vllm"},
                                "value": [time_s, repr(float(s.value))]})  # fmt: skip
                    if self.duplicate:
                        copy = repr(s.value + DUPLICATE_OFFSET)
                        out.append({"metric": {**labels, "job": "vllm-copy"},
                                    "value": [time_s, copy]})  # fmt: skip
        return out

    def __enter__(self) -> DuplicatingPrometheus:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
