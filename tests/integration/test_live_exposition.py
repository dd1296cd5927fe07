"""The exposition of live processes (`vllm-sizer run` and `vllm-sizer demo`) as Prometheus'
own `promtool check metrics` reads it: no warnings, no `_created` series, error labels at 0 from
the first cycle, build_info and wall-clock timestamps in the demo too."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.request import urlopen

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from exporter.base.errors import FailureReason
from exporter.testbed.emulator import EmulatedFleet
from tests.integration.test_daemon_e2e import (
    REPO,
    fleet,  # noqa: F401  (the emulated replicas fixture)
    free_port,
    start_daemon,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.integration
PROMTOOL = shutil.which("promtool")


def exposition(port: int) -> str:
    with urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def promtool_check(text: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None, "promtool missing: make test installs Debian's prometheus"
    return subprocess.run(
        [PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )


def test_promtool_reads_a_bad_exposition_as_bad() -> None:
    """The check below can fail: promtool warns on a counter without `_total`."""
    bad = "# HELP x_errors Errors.\n# TYPE x_errors counter\nx_errors 1\n"
    result = promtool_check(bad)
    assert result.returncode != 0 or result.stdout.strip() or result.stderr.strip()


def with_percentile_targets(config: Path) -> None:
    """Percentile targets beside the mean ones, so that their series are checked too."""
    doc = yaml.safe_load(config.read_text())
    doc["deployments"][0]["slo"].update(ttft={"p95_ms": 400}, itl={"p99_ms": 60})
    config.write_text(yaml.safe_dump(doc))


def test_the_daemons_exposition_is_clean(fleet: EmulatedFleet, tmp_path: Path) -> None:  # noqa: F811
    port, log = free_port(), tmp_path / "daemon.log"
    config = tmp_path / "config.yaml"
    write_config(config, fleet.urls, port, tmp_path / "state.json", seeded=True)
    with_percentile_targets(config)
    daemon = start_daemon(config, log)
    try:
        # Sized once: the percentile series are there too.
        wait_for(port, lambda v: "vllm_sizer_predicted_ttft_quantile_seconds" in v, 60)
        text = exposition(port)
    finally:
        daemon.terminate()
        daemon.wait(timeout=10)
    result = promtool_check(text)
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), (
        result.stdout + result.stderr
    )
    assert "_created" not in text
    labels = {
        s.name: s.labels for f in text_string_to_metric_families(text) for s in f.samples
    }
    assert labels["vllm_sizer_predicted_ttft_quantile_seconds"]["percentile"] == "95"
    itl = labels["vllm_sizer_predicted_itl_quantile_seconds"]
    assert (itl["percentile"], itl["kind"]) == ("99", "per_token")
    assert "vllm_sizer_binding_target" in labels
    zero = {
        s.labels["reason"]
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "vllm_sizer_scrape_errors_total"
    }
    assert zero == {r.value for r in FailureReason}


def test_the_demo_exports_wall_clock_time_and_build_info(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "exporter.cli.main", "demo", "--minutes", "4"]
    cmd += ["--time-scale", "20", "--port", "0", "--out", str(tmp_path)]
    demo = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert demo.stdout is not None
        port = None
        for line in demo.stdout:
            found = re.search(r"http://127\.0\.0\.1:(\d+)/metrics", line)
            if found:
                port = int(found.group(1))
                break
        assert port is not None
        deadline = time.monotonic() + 60
        while True:
            text = exposition(port)
            samples = {s.name: s for f in text_string_to_metric_families(text) for s in f.samples}
            if samples["vllm_sizer_last_successful_cycle_timestamp_seconds"].value > 0:
                break
            assert time.monotonic() < deadline, text[-2000:]
            time.sleep(0.5)
    finally:
        demo.terminate()
        demo.wait(timeout=20)
        if demo.stdout is not None:
            demo.stdout.close()
    assert samples["vllm_sizer_build_info"].labels["version"]
    stamp = samples["vllm_sizer_last_successful_cycle_timestamp_seconds"].value
    assert abs(stamp - time.time()) < 120  # wall time, not the simulation's clock
    assert "_created" not in text
    result = promtool_check(text)
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result.stdout
