"""Config validation: good files load; each bad key is named with its value and what is allowed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.base.errors import ConfigError
from exporter.config.loader import load_config, parse_config
from exporter.config.values import DemandKind
from exporter.sizing.points import new_tuner
from model.calibration.prior import GENERIC_PRIOR, Accelerator, default_prior

REPO = Path(__file__).resolve().parents[3]


def minimal(**overrides: Any) -> dict[str, Any]:
    dep: dict[str, Any] = {
        "name": "llama",
        "model_name": "llama-3",
        "source": {"scrape_urls": ["http://127.0.0.1:8000/metrics"]},
        "slo": {"ttft_ms": 500, "itl_ms": 50},
    }
    dep.update(overrides)
    return {"deployments": [dep]}


@pytest.mark.parametrize("name", ["example.yaml", "sidecar.yaml"])
def test_shipped_configs_load(name: str) -> None:
    # Their hosts are cluster names: resolving them is for the daemon at startup, not here.
    config = load_config(REPO / "config" / name, resolve_hosts=False)
    assert config.deployments and config.deployments[0].name == "llama-8b-vllm"


def test_k8s_configmaps_embed_valid_configs() -> None:
    for path in (REPO / "config" / "k8s").rglob("configmap.yaml"):
        doc = yaml.safe_load(path.read_text())
        config = parse_config(yaml.safe_load(doc["data"]["config.yaml"]))
        assert config.deployments, path


def test_defaults() -> None:
    config = parse_config(minimal())
    dep = config.deployments[0]
    assert config.cycle_period_s == 30 and config.listen_port == 9464
    assert dep.server.max_batch_size == 256 and dep.server.max_queue_size is None
    assert dep.scale_down_stabilization_s == 300 and dep.min_replicas == 1
    assert dep.tuner.min_observations == 5 and dep.tuner.window == 10
    assert dep.source.kind == "scrape"


LLAMA_ARCH = {"num_layers": 32, "hidden_size": 4096, "num_parameters": 8.03e9}
BAD = [
    ({"cycle_period_s": 0}, r"cycle_period_s: must be a number >= 1 and <= 3600 \(s.*got 0"),
    ({"listen_address": "9464"}, r"listen_address: must be HOST:PORT.*got '9464'"),
    ({"log_level": "loud"}, r"log_level: must be one of debug, info.*got 'loud'"),
    ({"colour": "blue"}, r"colour: unknown key \(allowed: .*\), got 'blue'"),
    ({"prometheus": {"url": "prometheus:9090"}}, r"prometheus.url: an http.*got 'prometheus:9090'"),
    ({"deployments": []}, r"deployments: must be a non-empty list"),
]
BAD_DEPLOYMENT = [
    ({"name": "Llama_3"}, r"deployments\[0\].name: a Kubernetes name.*got 'Llama_3'"),
    ({"model_name": None}, r"deployments\[0\].model_name: is required"),
    ({"slo": {"ttft_ms": -5}}, r"\[0\].slo.ttft_ms: must be a number > 0 \(ms\), got -5"),
    ({"slo": {"itl_p99": 50}}, r"slo.itl_p99: unknown key \(allowed: itl, itl_ms, ttft, ttft_ms\)"),
    ({"replicas": {"min": 4, "max": 2}}, r"deployments\[0\].replicas.max: must be >= replicas.min"),
    ({"replicas": {"min": -1}}, r"deployments\[0\].replicas.min: must be an integer >= 0, got -1"),
    (
        {"replicas": {"min": 0}},
        r"deployments\[0\].replicas.min: 0 needs a scale_from_zero section and a "
        r"prometheus_selector source .*got 0",
    ),
    ({"server": {"max_num_seqs": 2.5}}, r"server.max_num_seqs: must be an integer >= 1 .*got 2.5"),
    ({"server": {"max_queue_size": -1}}, r"server.max_queue_size: must be an integer >= 0"),
    ({"source": {}}, r"deployments\[0\].source: must set exactly one of scrape_urls"),
    ({"source": {"scrape_urls": ["localhost:8000"]}}, r"source.scrape_urls: must be a non-empty"),
    (
        {"source": {"prometheus_selector": '{ns="a"}'}},
        r"source.prometheus_selector: needs the top-level `prometheus` section",
    ),
    (
        {"initial_params": {"alpha_ms": 6.0, "beta_ms": 0}},
        r"initial_params.beta_ms: a number > 0 \(ms\), got 0",
    ),
    ({"tuner": {"window": 2}}, r"deployments\[0\].tuner.window: must be an integer >= 3 .*got 2"),
    ({"scale_down_stabilization_s": "5m"}, r"scale_down_stabilization_s: must be a number >= 0"),
    ({"look_ahead_s": -1}, r"deployments\[0\].look_ahead_s: must be a number >= 0"),
    (
        {"rate_margin_sigmas": 12},
        r"deployments\[0\].rate_margin_sigmas: must be a number >= 0 and <= 10 .*got 12",
    ),
    ({"model": {"variant": "fancy"}}, r"model.variant: must be one of paper, refined, got 'fancy'"),
    ({"model": {"arrival_cv": -0.5}}, r"model.arrival_cv: must be a number >= 0"),
    (
        {"model": {"architecture": {"num_layers": 32}}},
        r"model.architecture.hidden_size: is required",
    ),
    (
        {"model": {"architecture": {**LLAMA_ARCH, "num_kv_heads": 8}}},
        r"model.architecture: must set num_kv_heads and head_dim together",
    ),
    (
        {"model": {"architecture": {**LLAMA_ARCH, "kv_cache_bytes": 0}}},
        r"model.architecture.kv_cache_bytes: must be a number > 0 and <= 16 \(bytes per element\), "
        "got 0",
    ),
    ({"accelerator": "H800"}, r"deployments\[0\].accelerator: must be one of H100, H200, A100"),
]


@pytest.mark.parametrize(("override", "pattern"), BAD)
def test_bad_top_level_keys(override: dict[str, Any], pattern: str) -> None:
    data = minimal()
    data.update(override)
    with pytest.raises(ConfigError, match=pattern):
        parse_config(data)


@pytest.mark.parametrize(("override", "pattern"), BAD_DEPLOYMENT)
def test_bad_deployment_keys(override: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        parse_config(minimal(**override))


def test_every_problem_is_reported_at_once() -> None:
    data = minimal(slo={"ttft_ms": -1}, replicas={"min": 0})
    data["cycle_period_s"] = -3
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert len(info.value.problems) == 3


def test_duplicate_names_are_refused() -> None:
    data = minimal()
    data["deployments"].append(dict(data["deployments"][0]))
    with pytest.raises(ConfigError, match=r"deployments\[1\].name: must be unique, got 'llama'"):
        parse_config(data)


def test_unreadable_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the file"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("deployments: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_model_options() -> None:
    arch = {"num_layers": 32, "hidden_size": 4096, "num_parameters": 8.03e9}
    dep = parse_config(minimal(model={"variant": "refined", "arrival_cv": 0, "architecture": arch}))
    options = dep.deployments[0].model
    assert options.variant == "refined" and options.arrival_cv == 0.0
    assert options.architecture is not None and options.architecture.num_layers == 32
    # The CVs the config gives are pinned: the measured ones are not used in their place.
    assert dep.deployments[0].pinned_inputs == {"arrival_cv"}
    assert parse_config(minimal()).deployments[0].pinned_inputs == frozenset()


def test_architecture_and_accelerator_give_the_physical_prior() -> None:
    arch = {**LLAMA_ARCH, "num_kv_heads": 8, "head_dim": 128}
    dep = parse_config(minimal(model={"architecture": arch}, accelerator="H100")).deployments[0]
    assert dep.model.architecture is not None
    assert dep.model.architecture.kv_bytes_per_token == 131_072
    assert dep.accelerator == "H100"
    tuner = new_tuner(dep)
    assert tuner.prior == default_prior(dep.model.architecture, Accelerator.H100)
    assert tuner.prior != GENERIC_PRIOR
    # Either one alone leaves the generic prior.
    alone = parse_config(minimal(accelerator="A100")).deployments[0]
    assert new_tuner(alone).prior is GENERIC_PRIOR


# --- scale_from_zero ---------------------------------------------------------------------------

CENTRAL = {"prometheus_selector": '{namespace="inference"}'}
DEMAND = "sum(rate(router_requests_total[1m]))"


def central(**overrides: Any) -> dict[str, Any]:
    data = minimal(source=CENTRAL, **overrides)
    data["prometheus"] = {"url": "http://127.0.0.1:9090"}
    return data


def test_scale_from_zero_loads_with_its_defaults() -> None:
    zero = {"demand_query": DEMAND, "idle_s": 600}
    (dep,) = parse_config(central(replicas={"min": 0, "max": 4}, scale_from_zero=zero)).deployments
    assert dep.min_replicas == 0 and dep.serving_min_replicas == 1
    assert dep.scale_from_zero is not None
    assert dep.scale_from_zero.demand_query == DEMAND and dep.scale_from_zero.idle_s == 600.0
    assert dep.scale_from_zero.demand is DemandKind.RATE
    zero["demand"] = "queue"
    (dep,) = parse_config(central(replicas={"min": 0}, scale_from_zero=zero)).deployments
    assert dep.scale_from_zero is not None and dep.scale_from_zero.demand is DemandKind.QUEUE


BAD_ZERO = [
    # replicas.min 0 without the section, whatever the source
    ({"replicas": {"min": 0}}, r"deployments\[0\].replicas.min: 0 needs a scale_from_zero.*got 0"),
    # the section without replicas.min 0
    (
        {"scale_from_zero": {"demand_query": DEMAND, "idle_s": 60}},
        r"deployments\[0\].replicas.min: must be 0 with scale_from_zero, got 1",
    ),
    (
        {"replicas": {"min": 0}, "scale_from_zero": {"idle_s": 60}},
        r"deployments\[0\].scale_from_zero.demand_query: is required \(a PromQL expression",
    ),
    (
        {"replicas": {"min": 0}, "scale_from_zero": {"demand_query": DEMAND}},
        r"deployments\[0\].scale_from_zero.idle_s: is required \(a number > 0 and <= 86400",
    ),
    (
        {"replicas": {"min": 0}, "scale_from_zero": {"demand_query": DEMAND, "idle_s": 0}},
        r"deployments\[0\].scale_from_zero.idle_s: a number > 0 and <= 86400 .*got 0",
    ),
    (
        {"replicas": {"min": 0}, "scale_from_zero": {"demand_query": DEMAND, "idle_s": "5m"}},
        r"deployments\[0\].scale_from_zero.idle_s: a number > 0 .*got '5m'",
    ),
    (
        {"replicas": {"min": 0}, "scale_from_zero": {"demand_query": DEMAND, "idle_s": 1e6}},
        r"deployments\[0\].scale_from_zero.idle_s: a number > 0 and <= 86400 .*got 1000000.0",
    ),
    (
        {"replicas": {"min": 0}, "scale_from_zero": {"demand_query": "sum(rate(x[1m])", "idle_s": 9}},  # noqa: E501
        r"scale_from_zero.demand_query: a PromQL expression .*balanced brackets.*"
        r"got 'sum\(rate\(x\[1m\]\)'",
    ),
    (
        {"replicas": {"min": 0}, "scale_from_zero": {"demand_query": "  ", "idle_s": 9}},
        r"scale_from_zero.demand_query: a PromQL expression.*got '  '",
    ),
    (
        {"replicas": {"min": 0}, "scale_from_zero": {"demand_query": 42, "idle_s": 9}},
        r"scale_from_zero.demand_query: a PromQL expression.*got 42",
    ),
    (
        {"replicas": {"min": 0}, "scale_from_zero": {"demand_query": "x" * 5000, "idle_s": 9}},
        r"scale_from_zero.demand_query: a PromQL expression of one value, at most 4096 char",
    ),
    (
        {
            "replicas": {"min": 0},
            "scale_from_zero": {"demand_query": DEMAND, "idle_s": 9, "demand": "tokens"},
        },
        r"scale_from_zero.demand: must be one of rate, queue, got 'tokens'",
    ),
    (
        {"replicas": {"min": 0}, "scale_from_zero": {"demand_query": DEMAND, "idle": 9}},
        r"scale_from_zero.idle: unknown key \(allowed: demand, demand_query, idle_s\)",
    ),
    ({"replicas": {"min": 0}, "scale_from_zero": "yes"}, r"scale_from_zero: must be a mapping"),
]


@pytest.mark.parametrize(("override", "pattern"), BAD_ZERO)
def test_bad_scale_from_zero_keys(override: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        parse_config(central(**override))


def test_scale_from_zero_with_a_scrape_source_names_the_section() -> None:
    zero = {"demand_query": DEMAND, "idle_s": 60}
    with pytest.raises(ConfigError) as info:
        parse_config(minimal(replicas={"min": 0}, scale_from_zero=zero))
    assert info.value.problems == [
        "deployments[0].scale_from_zero: needs a prometheus_selector source (central mode): a "
        "scrape source has no pod to read at zero, got {'demand_query': "
        "'sum(rate(router_requests_total[1m]))', 'idle_s': 60}"
    ]


def test_brackets_inside_quotes_do_not_count() -> None:
    query = 'sum(rate(router_requests_total{path=~"/v1/(chat|completions"}[1m]))'
    zero = {"demand_query": query, "idle_s": 60}
    (dep,) = parse_config(central(replicas={"min": 0}, scale_from_zero=zero)).deployments
    assert dep.scale_from_zero is not None and dep.scale_from_zero.demand_query == query
