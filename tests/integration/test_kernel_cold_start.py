"""`vllm-sizer run` with an empty kernel cache (NUMBA_CACHE_DIR, as in the image): /healthz and
/metrics answer within 3 s of the start while the model's kernel compiles, and the compiled code
lands in the cache directory before the first cycle."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.error import URLError
from urllib.request import urlopen

import pytest
import yaml

from tests.integration.test_daemon_e2e import REPO, free_port

pytestmark = pytest.mark.integration
START_S = 3.0  # issue 19: the server answers within this of the start, cold cache


def _status(port: int, path: str) -> int | None:
    try:
        with urlopen(f"http://127.0.0.1:{port}{path}", timeout=1) as resp:
            return int(resp.status)
    except (URLError, ConnectionError, TimeoutError):
        return None


def test_server_answers_before_the_kernel_compiles(tmp_path: Path) -> None:
    port, dead = free_port(), free_port()  # a scrape URL nobody answers: cycles fail, daemon runs
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "cycle_period_s": 5,
        "listen_address": f"127.0.0.1:{port}",
        "deployments": [{
            "name": "llama", "model_name": "llama",
            "source": {"scrape_urls": [f"http://127.0.0.1:{dead}/metrics"]},
            "slo": {"ttft_ms": 50.0, "itl_ms": 25.0},
        }],
    }))  # fmt: skip
    cache = tmp_path / "kernel-cache"
    log = tmp_path / "daemon.log"
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), PYTHONUNBUFFERED="1")
    started = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "exporter.cli.main", "run", "--config", str(config)],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    try:
        answered: dict[str, float] = {}
        while len(answered) < 2 and time.monotonic() - started < 30.0:
            for path in ("/healthz", "/metrics"):
                if path not in answered and _status(port, path) == 200:
                    answered[path] = time.monotonic() - started
            time.sleep(0.05)
        compiled_yet = "model kernel ready" in log.read_text()
        assert answered.get("/healthz", 99.0) <= START_S, (answered, log.read_text())
        assert answered.get("/metrics", 99.0) <= START_S, (answered, log.read_text())
        # The cache was empty: the server answered while the kernel was still compiling.
        assert not compiled_yet, log.read_text()
        deadline = time.monotonic() + 120.0
        while "model kernel ready" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "model kernel ready" in log.read_text(), log.read_text()
        assert any(cache.rglob("*.nbc")), "no compiled code in NUMBA_CACHE_DIR"
        assert _status(port, "/healthz") == 200
    finally:
        proc.terminate()
        proc.wait(timeout=20)
