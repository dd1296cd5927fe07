"""A real Prometheus server for integration tests (Debian's `prometheus` binary).

    def test_something(start_prometheus):                   # fixture from conftest.py
        prom = start_prometheus(["http://127.0.0.1:8001/metrics"], scrape_interval_s=0.5)
        prom.base_url                                        # "http://127.0.0.1:<free port>"
        prom.wait_for_scrape(after_s=time.time())            # every target scraped since then
        prom.set_targets([...])                              # file-based discovery: applied live

Each server gets a free loopback port, a generated config, its own temporary storage folder and
a log file; the fixture stops every server it started when the test ends, whatever happens. A
missing binary fails the test loudly instead of skipping it, because `make test` installs it.
Targets are discovered from a JSON file (`file_sd_configs`), so each target keeps its own
metrics path and extra labels, and `set_targets()` changes them without a restart.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests

BINARY_ENV = "VLLM_SIZER_PROMETHEUS"  # optional path override for the binary
JOB = "integration"
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
POLL_S = 0.1


def prometheus_binary() -> str:
    """Path of the prometheus binary; a missing one fails the test (never skips it)."""
    path = os.environ.get(BINARY_ENV) or shutil.which("prometheus")
    if not path or not os.access(path, os.X_OK):
        pytest.fail(
            "the `prometheus` binary is not installed: run `make prometheus` (Debian package "
            f"`prometheus`) or set {BINARY_ENV}; integration tests need a real server",
            pytrace=False,
        )
    return path


@dataclass(frozen=True, slots=True)
class Target:
    """One scrape target: a full /metrics URL plus extra labels to attach to its series."""

    url: str
    labels: Mapping[str, str] = field(default_factory=dict)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _duration(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


class PrometheusServer:
    """One Prometheus process on 127.0.0.1; start() it, query `base_url`, stop() it."""

    def __init__(
        self,
        targets: Sequence[str | Target],
        *,
        workdir: Path,
        scrape_interval_s: float = 0.5,
        binary: str | None = None,
    ) -> None:
        self.workdir = workdir
        self.scrape_interval_s = scrape_interval_s
        self._binary = binary or prometheus_binary()
        self._targets_file = workdir / "targets.json"
        self._config_file = workdir / "prometheus.yml"
        self.log_file = workdir / "prometheus.log"
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen[bytes] | None = None
        self.set_targets(targets)
        interval = _duration(scrape_interval_s)
        # Scrape timeout <= interval is required; lookback stays at its 5m default.
        self._config_file.write_text(
            json.dumps(
                {
                    "global": {"scrape_interval": interval, "scrape_timeout": interval},
                    "scrape_configs": [
                        {
                            "job_name": JOB,
                            "file_sd_configs": [
                                {"files": [str(self._targets_file)], "refresh_interval": "1s"}
                            ],
                        }
                    ],
                },
                indent=2,
            )
        )

    def set_targets(self, targets: Sequence[str | Target]) -> None:
        """Replace the scrape targets (Prometheus re-reads the file within about a second)."""
        groups = []
        for item in targets:
            target = item if isinstance(item, Target) else Target(item)
            parts = urlsplit(target.url)
            labels = {"__metrics_path__": parts.path or "/metrics", "__scheme__": parts.scheme}
            labels.update(target.labels)
            groups.append({"targets": [parts.netloc], "labels": labels})
        temp = self._targets_file.with_suffix(".tmp")
        temp.write_text(json.dumps(groups))
        temp.replace(self._targets_file)  # atomic: Prometheus never reads half a file

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> PrometheusServer:
        """Run the binary and wait until /-/ready answers 200."""
        args = [
            self._binary,
            f"--config.file={self._config_file}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        with self.log_file.open("wb") as log:
            self._process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"prometheus exited with {self._process.returncode}: {self.log()}"
                )
            if self.is_ready():
                return self
            time.sleep(POLL_S)
        self.stop()
        raise RuntimeError(f"prometheus not ready after {timeout_s} s: {self.log()}")

    def is_ready(self) -> bool:
        """True when /-/ready answers 200."""
        try:
            return requests.get(self.base_url + "/-/ready", timeout=1.0).status_code == 200
        except requests.RequestException:
            return False  # not listening yet

    def stop(self) -> None:
        """Terminate the process (kill it if it does not exit in time); safe to call twice."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=STOP_TIMEOUT_S)

    def log(self, tail_chars: int = 2000) -> str:
        """The end of the server's log, for failure messages."""
        text = self.log_file.read_text(errors="replace") if self.log_file.exists() else ""
        return text[-tail_chars:]

    def active_targets(self) -> list[dict[str, object]]:
        """/api/v1/targets' active targets (health, lastScrape, labels, ...)."""
        body = requests.get(self.base_url + "/api/v1/targets", timeout=5.0).json()
        return list(body["data"]["activeTargets"])

    def wait_for_scrape(
        self,
        *,
        after_s: float,
        count: int | None = None,
        health: str = "up",
        timeout_s: float = 20.0,
    ) -> None:
        """Wait until `count` targets (default: all) were scraped after `after_s` (unix s) with
        the given outcome ("up", or "down" for a failed scrape)."""
        wanted = count if count is not None else len(json.loads(self._targets_file.read_text()))
        deadline = time.monotonic() + timeout_s
        while True:
            fresh = [
                t
                for t in self.active_targets()
                if t.get("health") == health and _unix(str(t.get("lastScrape", ""))) > after_s
            ]
            if len(fresh) >= wanted:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{len(fresh)} of {wanted} targets {health} since {after_s}: "
                    f"{self.active_targets()} {self.log()}"
                )
            time.sleep(POLL_S)


def _unix(rfc3339: str) -> float:
    """Prometheus's lastScrape (RFC 3339, nanoseconds, 'Z' or offset) -> unix s; 0 if unset."""
    if not rfc3339 or rfc3339.startswith("0001-"):
        return 0.0
    text = rfc3339.replace("Z", "+00:00")
    head, sep, rest = text.partition(".")
    if sep:  # Python parses at most microseconds: trim the fraction to 6 digits
        digits = "".join(c for c in rest if c.isdigit())
        text = f"{head}.{digits[:6]}{rest[len(digits) :]}"
    return datetime.fromisoformat(text).timestamp()


StartPrometheus = Callable[..., PrometheusServer]


@pytest.fixture
def start_prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartPrometheus]:
    """Factory: start_prometheus(targets, scrape_interval_s=0.5) -> a started PrometheusServer."""
    started: list[PrometheusServer] = []

    def start(
        targets: Sequence[str | Target], *, scrape_interval_s: float = 0.5
    ) -> PrometheusServer:
        workdir = tmp_path_factory.mktemp("prometheus")
        server = PrometheusServer(targets, workdir=workdir, scrape_interval_s=scrape_interval_s)
        started.append(server)
        return server.start()

    try:
        yield start
    finally:
        for server in started:
            server.stop()
