"""`vllm-sizer plan --config`: the cheapest mix of a configured model's variants."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from exporter.cli.main import main
from exporter.config.loader import load_config
from exporter.daemon.deployment_state import saved_state
from exporter.daemon.statefile import StateFile
from exporter.sizing.cycle import Sizer
from exporter.sizing.fleet_cycle import variant_capacity_rps
from exporter.sizing.points import new_tuner
from model import ServiceParams, Workload

SEED = ServiceParams(9.0, 3.0e-2, 8.0e-5)

CONFIG = {
    "prometheus": {"url": "http://127.0.0.1:9090"},
    "accelerators": {
        "H100": {"price_per_gpu_hour": 4.0, "inventory": 8},
        "L40S": {"price_per_gpu_hour": 1.0, "inventory": {"query": "sum(gpus)"}},
    },
    "models": [{
        "name": "llama",
        "slo": {"ttft": {"p95_ms": 300}},
        "variants": [
            {"name": "on-h100", "accelerator": "H100",
             "source": {"prometheus_selector": '{d="h100"}'}},
            {"name": "on-l40s", "accelerator": "L40S",
             "source": {"prometheus_selector": '{d="l40s"}'}},
        ],
    }],
}  # fmt: skip


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    return path


def rows(out: str) -> dict[str, int]:
    found = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) == 3 and parts[0].startswith("on-"):
            found[parts[0]] = int(parts[1])
    return found


def test_given_capacities_the_mix_is_the_hand_computed_cheapest(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 21 req/s; an H100 replica carries 10 for 4/h, an L40S one 3 for 1/h, 4 L40S GPUs: the four
    # L40S replicas carry 12 and one H100 the rest, for 8/h (two H100 and two L40S: 10/h; three
    # H100: 12/h).
    code = main(["plan", "--config", str(config), "--fleet-model", "llama", "--rate", "21",
                 "--capacity", "on-h100=10", "--capacity", "on-l40s=3",
                 "--inventory", "L40S=4"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert rows(out) == {"on-h100": 1, "on-l40s": 4}
    assert "cost per hour 8.00; unserved 0.000 req/s" in out


def test_too_few_gpus_leave_demand_unserved(config: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--config", str(config), "--fleet-model", "llama", "--rate", "100",
                 "--capacity", "on-h100=10", "--capacity", "on-l40s=3", "--inventory", "L40S=2",
                 "--inventory", "H100=2"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and rows(out) == {"on-h100": 2, "on-l40s": 2}
    assert "(inventory_limited)" in out and "unserved 74.000 req/s" in out


def test_from_priors_a_queried_inventory_must_be_given(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["plan", "--config", str(config), "--fleet-model", "llama", "--rate", "21"])
    assert code == 2
    assert "--inventory: give the GPUs of L40S" in capsys.readouterr().err
    code = main(["plan", "--config", str(config), "--fleet-model", "llama", "--rate", "21",
                 "--inventory", "L40S=4"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and sum(rows(out).values()) >= 1  # the generic prior's capacities


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fleet-model", "llama", "--rate", "3"], "argument --config: is required"),
        (["--config", "x.yaml", "--rate", "3"], "argument --config: needs --fleet-model"),
        (["--config", "x.yaml", "--fleet-model", "m", "--rate", "3", "--capacity", "a=-1"],
         "argument --capacity: must be NAME=NUMBER >= 0, got 'a=-1'"),
    ],
)
def test_bad_fleet_arguments_are_named(args: list[str], message: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["plan", *args])
    assert message in capsys.readouterr().err


def test_an_unknown_model_is_named(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--config", str(config), "--fleet-model", "qwen", "--rate", "1"])
    assert code == 2
    assert "--fleet-model: unknown model 'qwen' (known: llama)" in capsys.readouterr().err


def capacities(out: str) -> dict[str, float]:
    found = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) == 3 and parts[0].startswith("on-"):
            found[parts[0]] = float(parts[2])
    return found


def test_a_daemons_state_file_gives_the_variants_their_calibration(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A state whose H100 tuner holds other parameters than the configuration's prior: with
    # --state the H100 capacity is computed from them (and the L40S's prior is their transfer
    # only once the H100 is trusted, which a seed alone is not).
    loaded = load_config(config, resolve_hosts=False)
    sizer = Sizer(loaded.deployments)
    h100 = sizer.cycles["on-h100"]
    h100.tuner = new_tuner(h100.config, seed=SEED)
    state = tmp_path / "state.json"
    StateFile(state).save(saved_state(sizer.cycles))
    base = ["plan", "--config", str(config), "--fleet-model", "llama", "--rate", "10",
            "--inventory", "L40S=4", "--input-tokens", "512", "--output-tokens", "128"]
    assert main(base) == 0
    without = capacities(capsys.readouterr().out)
    assert main([*base, "--state", str(state)]) == 0
    with_state = capacities(capsys.readouterr().out)
    dep = {d.name: d for d in loaded.deployments}["on-h100"]
    expected = variant_capacity_rps(dep, SEED, Workload(512, 128), None) * (1 - 0.25)
    assert with_state["on-h100"] == pytest.approx(expected, rel=1e-3)
    assert with_state["on-h100"] != pytest.approx(without["on-h100"], rel=1e-2)
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    assert main([*base, "--state", str(bad)]) == 2
    assert f"--state: {bad}: not JSON" in capsys.readouterr().err
