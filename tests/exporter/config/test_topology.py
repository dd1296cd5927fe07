"""Shards and replica identity: every deployment owned by exactly one shard, whatever the count;
a model's variants together; the owner the same in every process; config errors name the key
and the value."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.base.errors import ConfigError
from exporter.config.loader import parse_config
from exporter.config.topology import (
    REPLICA_ENV,
    owned,
    place,
    replica_identity,
    shard_index,
    shard_of,
)
from exporter.config.values import ShardConfig
from tests.conftest import REPO_ROOT


def deployment(name: str, model: str) -> dict[str, Any]:
    return {
        "name": name,
        "model_name": model,
        "source": {"scrape_urls": ["http://127.0.0.1:1/metrics"]},
        "slo": {"ttft_ms": 500},
    }


def config(models: list[str], **top: Any) -> Any:
    deps = [deployment(f"d-{i}", model) for i, model in enumerate(models)]
    return parse_config({"deployments": deps, **top})


@settings(max_examples=200, deadline=None)
@given(
    models=st.lists(st.text(min_size=1, max_size=40), min_size=1, max_size=60),
    count=st.integers(min_value=1, max_value=64),
)
def test_every_deployment_is_owned_by_exactly_one_shard(models: list[str], count: int) -> None:
    class Dep:
        def __init__(self, model_name: str) -> None:
            self.model_name = model_name

    deps = [Dep(m) for m in models]
    shares = [owned(deps, count, index) for index in range(count)]
    for dep in deps:
        assert sum(dep in share for share in shares) == 1
    # Variants of one model (equal model_name) share a shard.
    for share in shares:
        mine = {d.model_name for d in share}
        assert all(d in share for d in deps if d.model_name in mine)


def test_shards_split_a_hundred_models_roughly_evenly() -> None:
    sizes = [
        len(owned([type("D", (), {"model_name": f"org/model-{i}"})() for i in range(100)], 3, k))
        for k in range(3)
    ]
    assert sum(sizes) == 100 and min(sizes) >= 20, sizes


def test_the_owner_is_the_same_in_another_process_with_another_hash_seed() -> None:
    models = [f"org/model-{i}" for i in range(50)]
    here = [shard_of(m, 7) for m in models]
    code = (
        f"from exporter.config.topology import shard_of;print([shard_of(m, 7) for m in {models!r}])"
    )
    for seed in ("1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO_ROOT)}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == str(here)
    # Python's hash() of a str differs between those two seeds: it would have split the fleet.


@pytest.mark.parametrize(
    ("shard", "message"),
    [
        ({"count": 0}, "shard.count: an integer >= 1 and <= 1024, got 0"),
        ({"count": "3"}, "shard.count: an integer >= 1 and <= 1024, got '3'"),
        ({"count": 3, "index": 3}, "shard.index: must be < shard.count (3), got 3"),
        ({"count": 3, "index": -1}, "shard.index: must be an integer >= 0"),
        ({"index": 1}, "shard.count: is required"),
        ({"count": 2, "size": 1}, "shard.size: unknown key"),
    ],
)
def test_shard_errors_name_the_key_and_the_value(shard: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        config(["m"], shard=shard)
    assert any(p.startswith(message) for p in err.value.problems), err.value.problems


def test_replica_errors_name_the_key_or_the_variable_and_the_value() -> None:
    with pytest.raises(ConfigError) as err:
        config(["m"], replica="two words")
    assert err.value.problems[0].startswith("replica: must be a name like a pod's")
    assert err.value.problems[0].endswith("got 'two words'")
    with pytest.raises(ConfigError) as err:
        replica_identity(None, {REPLICA_ENV: "a/b"})
    assert err.value.problems == [f"${REPLICA_ENV}: must be a name like a pod's, got 'a/b'"]


def test_replica_comes_from_the_key_then_the_environment_else_none() -> None:
    assert replica_identity("sizer-a", {REPLICA_ENV: "vllm-sizer-1"}) == "sizer-a"
    assert replica_identity(None, {REPLICA_ENV: "vllm-sizer-1"}) == "vllm-sizer-1"
    # No label by default: a single replica keeps today's series (HOSTNAME is not read).
    assert replica_identity(None, {"HOSTNAME": "vllm-sizer-6d9f"}) is None


@pytest.mark.parametrize(
    ("replica", "count", "index"),
    [("vllm-sizer-0", 3, 0), ("vllm-sizer-4", 3, 1), ("vllm-sizer-5", 3, 2), ("s-7", 1, 0)],
)
def test_statefulset_ordinal_o_is_shard_o_mod_count(replica: str, count: int, index: int) -> None:
    assert shard_index(ShardConfig(count), replica) == index
    assert shard_index(ShardConfig(count, 0), replica) == 0  # a configured index wins


def test_no_index_and_no_ordinal_is_an_error_naming_the_replica() -> None:
    with pytest.raises(ConfigError) as err:
        shard_index(ShardConfig(3), "vllm-sizer-abc")
    assert "shard.index: is required" in err.value.problems[0]
    assert "'vllm-sizer-abc'" in err.value.problems[0]


def test_place_keeps_only_this_shards_deployments() -> None:
    models = [f"org/model-{i}" for i in range(30)]
    full = config(models, shard={"count": 3})
    names = []
    for ordinal in range(6):  # 3 shards x 2 replicas
        mine, replica = place(full, {REPLICA_ENV: f"vllm-sizer-{ordinal}"})
        assert replica == f"vllm-sizer-{ordinal}"
        assert mine.shard == ShardConfig(3, ordinal % 3)
        names.append([d.name for d in mine.deployments])
    assert names[:3] == names[3:]  # replica 1 of each shard sizes what replica 0 does
    assert sorted(n for share in names[:3] for n in share) == sorted(
        d.name for d in full.deployments
    )
    unsharded, replica = place(config(models), {})
    assert unsharded.deployments == full.deployments and replica is None


def test_a_shard_with_no_model_is_an_error() -> None:
    one = config(["only/model"], shard={"count": 2})
    owner = shard_of("only/model", 2)
    with pytest.raises(ConfigError) as err:
        place(one, {REPLICA_ENV: f"vllm-sizer-{1 - owner}"})
    assert err.value.problems[0].startswith(f"shard.index: shard {1 - owner} of 2 owns none")
