"""X1, C9, C10, H4, X6: what a new user types that the command line and the config took badly:
`plan | head`, `emulate` on a port in use, a configuration that is a list, an architecture of
1e300 parameters, a what-if at a denormal rate, a load range of one value."""

from __future__ import annotations

import math
import socket
import subprocess
import sys
from typing import Any

import pytest

from exporter.base.errors import ConfigError
from exporter.cli.main import main
from exporter.config.loader import parse_config
from exporter.config.values import DeploymentConfig, SloConfig, SourceConfig
from exporter.sizing.points import new_tuner
from exporter.sizing.what_if import ServedEstimate, predict
from model import ServerConfig, ServiceParams, Workload
from tests.conftest import REPO_ROOT

LLAMA = ServiceParams(6.68, 2.01e-2, 5.52e-5)
CLI = [sys.executable, "-m", "exporter.cli.main"]


def test_plan_into_a_closed_pipe_prints_no_traceback() -> None:
    """`plan | head -1`: the reader leaves before the table is written."""
    proc = subprocess.Popen(
        [*CLI, "plan", "--ttft-ms", "200", "--itl-ms", "30", "--load", "1", "200"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    with proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # as `head` does once it has its line
        stderr = proc.stderr.read().decode()
        proc.wait(timeout=120)
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr


def test_emulate_on_a_port_in_use_is_one_error_line_naming_the_flag() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [*CLI, "emulate", "--rate-rps", "1", "--replicas", "1", "--base-port", str(port),
             "--stop-after-s", "1"],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"--base-port {port}" in proc.stderr and "in use" in proc.stderr, proc.stderr


@pytest.mark.parametrize("document", [["a", "b"], "text", 5])
def test_a_configuration_that_is_no_mapping_names_the_top_level(document: Any) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(document)
    first = info.value.problems[0]
    assert not first.startswith(":") and first.startswith("(top level): must be a mapping"), first


def test_an_architecture_beyond_any_model_is_refused_naming_the_key() -> None:
    """num_parameters 1e300 put the physical prior's centre at 1e288 ms."""
    dep = {
        "name": "llama", "model_name": "m", "accelerator": "H100",
        "source": {"scrape_urls": ["http://127.0.0.1:8000/metrics"]},
        "slo": {"ttft_ms": 500, "itl_ms": 50},
        "model": {"architecture": {"num_layers": 32, "hidden_size": 4096,
                                   "num_parameters": 1e300, "num_kv_heads": 8, "head_dim": 128}},
    }  # fmt: skip
    with pytest.raises(ConfigError) as info:
        parse_config({"deployments": [dep]})
    [problem] = info.value.problems
    assert problem.startswith("deployments[0].model.architecture.num_parameters:"), problem
    assert "1e+300" in problem


@pytest.mark.parametrize("rate", [1e-320, 5e-324, 1e-300, 1e-12])
def test_a_what_if_at_a_denormal_rate_answers_the_idle_latencies(rate: float) -> None:
    """rate=1e-320 answered a mean ITL of 8.4e20 s (0/0 at the edge of the floats)."""
    dep = DeploymentConfig(
        name="llama", model_name="llama", source=SourceConfig(scrape_urls=("http://x:1/",)),
        server=ServerConfig(), slo=SloConfig(ttft_ms=60.0, itl_ms=20.0), initial_params=LLAMA,
    )  # fmt: skip
    # What /api/v1/predict answers from: the estimate a cycle publishes (here the seed's).
    served = ServedEstimate(
        config=dep, tuner=new_tuner(dep).estimate(), workload=Workload(512, 128), inputs=None,
        current_replicas=None,
    )  # fmt: skip
    idle = predict(served, 0.0, None, ())
    tiny = predict(served, rate, None, ())
    assert tiny.total_rate_rps == rate
    assert math.isclose(tiny.itl_ms, idle.itl_ms, rel_tol=1e-6), (tiny.itl_ms, idle.itl_ms)
    assert math.isclose(tiny.ttft_ms, idle.ttft_ms, rel_tol=1e-6), (tiny.ttft_ms, idle.ttft_ms)


def test_plan_with_one_load_value_prints_one_row(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--ttft-ms", "200", "--itl-ms", "30", "--load", "30", "30"]) == 0
    table = capsys.readouterr().out.split("total load req/s")[1].strip().splitlines()
    rows = [line for line in table[1:] if line.strip()]
    assert len(rows) == 1, rows
