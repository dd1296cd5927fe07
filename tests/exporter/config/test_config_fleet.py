"""The fleet sections: accelerators, models and their variants."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.base.errors import ConfigError
from exporter.config.loader import load_config, parse_config
from exporter.config.topology import place, shard_of
from exporter.config.values import Routing
from model.calibration.prior import Accelerator

REPO = Path(__file__).resolve().parents[3]
FLEET: dict[str, Any] = {
    "prometheus": {"url": "http://prom:9090"},
    "accelerators": {
        "H100": {"price_per_gpu_hour": 4.0, "inventory": 8},
        "L40S": {"price_per_gpu_hour": 1.0, "inventory": {"query": "sum(gpus)"}},
    },
    "models": [
        {
            "name": "llama",
            "priority": 2,
            "routing": "even",
            "slo": {"ttft": {"p95_ms": 300}},
            "variants": [
                {
                    "name": "chat-h100",
                    "accelerator": "H100",
                    "gpus_per_replica": 2,
                    "startup_delay_s": 120,
                    "server": {"max_num_seqs": 128},
                    "source": {"prometheus_selector": '{deployment="chat-h100"}'},
                },
                {
                    "name": "chat-l40s",
                    "accelerator": "L40S",
                    "replicas": {"max": 4},
                    "source": {"scrape_urls": ["http://l40s:8000/metrics"]},
                },
            ],
        }
    ],
}


def _problems(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    return str(err.value)


def test_variants_are_deployments_with_their_models_targets() -> None:
    config = parse_config(FLEET)
    assert config.fleet is not None
    h100, l40s = config.deployments
    assert (h100.name, h100.model_name, h100.gpus_per_replica) == ("chat-h100", "llama", 2)
    assert h100.accelerator is Accelerator.H100 and h100.startup_delay_s == 120
    assert h100.server.max_batch_size == 128
    assert h100.slo == l40s.slo and h100.slo.percentiles[0].target_ms == 300
    assert (l40s.min_replicas, l40s.max_replicas) == (0, 4)  # a variant may sit at 0
    model = config.fleet.models[0]
    assert (model.priority, model.routing, model.variants) == (2, Routing.EVEN,
                                                               ("chat-h100", "chat-l40s"))
    h, l_ = config.fleet.accelerators
    assert (h.inventory, h.inventory_query) == (8, None)
    assert (l_.inventory, l_.inventory_query) == (None, "sum(gpus)")


def test_a_single_deployment_config_has_no_fleet() -> None:
    data = {"deployments": [{"name": "d", "model_name": "m", "slo": {"ttft_ms": 50},
                             "source": {"scrape_urls": ["http://x:1/metrics"]}}]}
    config = parse_config(data)
    assert config.fleet is None and config.deployments[0].gpus_per_replica == 1
    assert config.deployments[0].min_replicas == 1


def test_lone_deployments_sit_beside_the_models() -> None:
    data = copy.deepcopy(FLEET)
    data["deployments"] = [{"name": "lone", "model_name": "m", "slo": {"ttft_ms": 50},
                            "source": {"scrape_urls": ["http://x:1/metrics"]}}]
    names = [d.name for d in parse_config(data).deployments]
    assert names == ["lone", "chat-h100", "chat-l40s"]


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: d["accelerators"]["H100"].update(inventory=-1),
         "accelerators.H100.inventory: must be an integer >= 0 (GPUs) or {query: PromQL of one "
         "value, read each cycle}, got -1"),
        (lambda d: d["accelerators"]["L40S"].update(inventory={"query": "sum(("}),
         "accelerators.L40S.inventory.query: "),
        (lambda d: d["accelerators"]["H100"].update(price_per_gpu_hour="cheap"),
         "accelerators.H100.price_per_gpu_hour: must be a number >= 0"),
        (lambda d: d["accelerators"].update(A10G={"price_per_gpu_hour": 1, "inventory": 1}),
         "A10G"),
        (lambda d: d["models"][0]["variants"][1].update(accelerator="A100"),
         "models[0].variants[1].accelerator: must be one of the types in `accelerators` "
         "(H100, L40S), got 'A100'"),
        (lambda d: d["models"][0]["variants"][0].update(gpus_per_replica=0),
         "models[0].variants[0].gpus_per_replica: must be an integer >= 1"),
        (lambda d: d["models"][0]["variants"][0].update(slo={"ttft_ms": 5}),
         "models[0].variants[0]"),
        (lambda d: d["models"][0].update(routing="random"),
         "models[0].routing: must be one of weighted, even, got 'random'"),
        (lambda d: d["models"][0]["variants"][1].update(name="chat-h100"),
         "models: variant names must be unique, got 'chat-h100'"),
        (lambda d: d.pop("accelerators"), "accelerators: is required with `models`"),
        (lambda d: d.pop("prometheus"),
         "accelerators.L40S.inventory.query: needs the top-level `prometheus` section, got "
         "'sum(gpus)'"),
        (lambda d: d["models"][0]["variants"][0].update(startup_delay_s=-3),
         "models[0].variants[0].startup_delay_s: must be a number >= 0"),
    ],
)
def test_errors_name_the_key_and_the_value(edit: Any, expected: str) -> None:
    data = copy.deepcopy(FLEET)
    edit(data)
    assert expected in _problems(data)


def test_a_variant_named_like_a_lone_deployment_is_refused() -> None:
    data = copy.deepcopy(FLEET)
    data["deployments"] = [{"name": "chat-h100", "model_name": "m", "slo": {"ttft_ms": 50},
                            "source": {"scrape_urls": ["http://x:1/metrics"]}}]
    assert "models: a variant's name must differ from every deployment's, got 'chat-h100'" in (
        _problems(data))


def test_the_shipped_fleet_config_matches_its_scaled_objects() -> None:
    # One ScaledObject per variant Deployment, with the variant's replica bounds, scaling on
    # that deployment's desired_replicas.
    config = load_config(REPO / "config" / "fleet.yaml", resolve_hosts=False)
    assert config.fleet is not None and len(config.deployments) == 2
    objects = list(yaml.safe_load_all((REPO / "config" / "k8s" / "fleet-scaledobjects.yaml")
                                      .read_text()))
    by_target = {o["spec"]["scaleTargetRef"]["name"]: o["spec"] for o in objects}
    assert set(by_target) == {d.name for d in config.deployments}
    for dep in config.deployments:
        spec = by_target[dep.name]
        assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (dep.min_replicas,
                                                                      dep.max_replicas)
        (trigger,) = spec["triggers"]
        query = trigger["metadata"]["query"]
        assert f'deployment="{dep.name}"' in query and "vllm_sizer_desired_replicas" in query


def test_a_shard_keeps_the_fleet_models_whose_variants_it_owns() -> None:
    # Two models on two shards: each shard's fleet lists only its own model (the other's
    # variants are not among its deployments, and sizing them would find no cycle).
    data = copy.deepcopy(FLEET)
    other = copy.deepcopy(data["models"][0])
    other["name"] = "qwen"
    for v in other["variants"]:
        v["name"] = v["name"].replace("chat", "qwen")
    data["models"].append(other)
    owners = {shard_of(name, 2) for name in ("llama", "qwen")}
    assert owners == {0, 1}  # the two names land on different shards of 2
    for index in (0, 1):
        config, _ = place(parse_config(data | {"shard": {"count": 2, "index": index}}), {})
        assert config.fleet is not None
        (model,) = config.fleet.models
        assert shard_of(model.name, 2) == index
        assert {d.name for d in config.deployments} == set(model.variants)
