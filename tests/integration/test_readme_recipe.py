"""The README's laptop recipe works as written: the block between its `laptop-recipe` markers runs
in bash (emulated replicas, a config, `vllm-sizer run`, curl), and the daemon serves a desired
replica count.

The recipe's fixed ports (8100, 8101, 9464) are the one substitution: the test takes free
loopback ports instead, so that it cannot collide with anything else on the machine."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.integration

RECIPE_PORTS = ("8100", "8101", "9464")  # emulate --base-port, its second replica, the daemon
# One emulated replica's SLO capacity at the recipe's targets (mean TTFT 50 ms, mean ITL 25 ms):
# `vllm-sizer simulate --kv-capacity-tokens 449200 --rates 9,9.5` (seeds 0 and 1) crosses the
# mean TTFT target at 9.1 req/s. Issue 35: the published capacity is within 15 % of it, or a
# bound the windows proved, 0.5-1.0x of it. (The analytical model at the true parameters says
# 6.29, `vllm-sizer plan --ttft-ms 50 --itl-ms 25`: its TTFT is 13-17 % high, not the truth.)
TRUTH_RPS = 9.1


def readme_recipe() -> str:
    text = (REPO_ROOT / "README.md").read_text()
    block = re.search(
        r"<!-- laptop-recipe:begin -->\n```bash\n(.*?)```\n<!-- laptop-recipe:end -->", text, re.S
    )
    assert block is not None, "README.md: no laptop-recipe block"
    return block.group(1)


def free_ports() -> tuple[int, int, int]:
    """Two consecutive free ports (the replicas) and one more (the daemon)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base >= 65534:
            continue
        try:
            with socket.socket() as a, socket.socket() as b, socket.socket() as c:
                a.bind(("127.0.0.1", base))
                b.bind(("127.0.0.1", base + 1))
                c.bind(("127.0.0.1", 0))
                return base, base + 1, c.getsockname()[1]
        except OSError:
            continue
    raise RuntimeError("no two consecutive free ports on 127.0.0.1")


def test_readme_laptop_recipe_serves_a_desired_count(tmp_path: Path) -> None:
    recipe = readme_recipe()
    for port in RECIPE_PORTS:
        assert port in recipe, f"the recipe no longer uses port {port}: update this test"
    assert shutil.which("curl"), "the recipe needs curl"
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "vllm-sizer").exists(), "vllm-sizer is not installed beside this python"
    script = recipe
    for old, new in zip(RECIPE_PORTS, free_ports(), strict=True):
        script = re.sub(rf"\b{old}\b", str(new), script)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.Popen(
        ["bash", "-c", script],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: nothing outlives the test
    )
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    log = (tmp_path / "sizer.log").read_text()
    context = f"output:\n{out}\nsizer.log:\n{log}"
    desired = re.search(
        r'^vllm_sizer_desired_replicas\{deployment="laptop",model_name="emulated"\} (\d+)\.0$',
        out,
        re.M,
    )
    assert desired is not None, context
    assert 1 <= int(desired.group(1)) <= 8, context  # within the config's replicas.min/max
    assert re.search(r'^vllm_sizer_current_replicas\{[^}]*\} 2\.0$', out, re.M), context
    assert "reason=" in log and "Traceback" not in log, context
    # The what-if answers, or (the tuner not calibrated yet on a slow machine) says why not.
    assert re.search(r'^\{("deployment": "laptop"|"error": )', out, re.M), context
    fitted = re.search(r'^vllm_sizer_tuner_state\{[^}]*state="fitted"\} 1\.0$', out, re.M)
    if fitted is None:
        return  # calibrated nothing in 45 s (a loaded machine): no capacity to judge
    # The gauge and the what-if publish one claim (exporter.sizing.evidence, Envelope.claim):
    # within 15 % of the truth, or flagged extrapolated and a bound 0.5-1.0x of it. On main
    # before issue 35's gauge work the gauge read the fit's 11-18.6 req/s (1.2-2x the truth).
    gauge = re.search(
        r"^vllm_sizer_max_rate_per_replica_requests_per_second\{[^}]*\} (\S+)$", out, re.M
    )
    flag = re.search(r"^vllm_sizer_capacity_extrapolated\{[^}]*\} (\S+)$", out, re.M)
    assert gauge is not None, context
    flagged = flag is not None and float(flag.group(1)) == 1.0
    line = re.search(r'^(\{"deployment": "laptop".*)$', out, re.M)
    assert line is not None, context
    answer = json.loads(line.group(1))
    for published in (float(gauge.group(1)), answer["max_rate_per_replica_requests_per_second"]):
        close = abs(published / TRUTH_RPS - 1.0) <= 0.15
        bound = flagged and 0.5 * TRUTH_RPS <= published <= TRUTH_RPS
        assert close or bound, context
    # 30 req/s on the 2 replicas: 15 each, past the truth's saturation (11-12 req/s) and twice
    # the windows' load: not called stable on the model's word.
    assert answer["stable"] is not True, context
