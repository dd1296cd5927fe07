"""A sizer's replica identity and shard.

Sharding splits the deployments across several sizers by model name: each shard reads, sizes and
exports only the deployments whose model hashes to it, so every variant of a model (deployments
sharing its `model_name`) lands on the same shard. The hash is SHA-256, stable across processes
and Python versions, never Python's salted `hash()`: every shard must compute the same owner.

A replica's identity (the `sizer_replica` label on every series it exports) comes from the
`replica` key, else the VLLM_SIZER_REPLICA environment variable (the pod's name, set by the
central-ha package). Without either, no label is added and the series are today's: a single
replica has nothing to tell apart, and its dashboards and queries keep working unchanged.

In a StatefulSet of `count` shards x R replicas, pod ordinal o is shard o % count, replica o //
count: `shard.index` may then be left out and is taken from the replica name's ordinal.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol, TypeVar

from exporter.base.errors import ConfigError
from exporter.config.checks import KeyReader, integer, string
from exporter.config.values import Config, ShardConfig

REPLICA_ENV = "VLLM_SIZER_REPLICA"
REPLICA_LABEL = "sizer_replica"
MAX_SHARDS = 1024
# A Prometheus label value may be anything; a pod name is what it is meant to be.
REPLICA_PATTERN = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,251}[A-Za-z0-9])?")
_ORDINAL = re.compile(r".*-([0-9]+)")


class _Named(Protocol):
    @property
    def model_name(self) -> str: ...


D = TypeVar("D", bound=_Named)


def parse_shard(r: KeyReader, node: Any) -> ShardConfig | None:
    """The `shard` section (None without one)."""
    if node is None:
        return None
    path = "shard"
    m = r.mapping(node, path, {"index", "count"})
    count = r.required(
        m, "count", path, integer(1, MAX_SHARDS), f"an integer >= 1 and <= {MAX_SHARDS}"
    )
    index = r.get(
        m,
        "index",
        path,
        integer(0, MAX_SHARDS - 1),
        "must be an integer >= 0 and < shard.count (omitted: the replica name's ordinal % count)",
        None,
    )
    if count is not None and index is not None and index >= count:
        r.fail("shard.index", f"must be < shard.count ({count})", index)
    return ShardConfig(count or 1, index)


def parse_replica(r: KeyReader, node: Mapping[str, Any]) -> str | None:
    """The top-level `replica` key (None: from the environment, or no label)."""
    return r.get(
        node,
        "replica",
        "",
        string(REPLICA_PATTERN),
        "must be a name like a pod's (letters, digits, '-', '_', '.'; up to 253)",
        None,
    )


def replica_identity(configured: str | None, environ: Mapping[str, str]) -> str | None:
    """The `replica` key, else $VLLM_SIZER_REPLICA, else None (no label); a bad environment
    value is a ConfigError naming the variable and the value."""
    if configured is not None:
        return configured
    value = environ.get(REPLICA_ENV, "").strip()
    if not value:
        return None
    if not REPLICA_PATTERN.fullmatch(value):
        raise ConfigError([f"${REPLICA_ENV}: must be a name like a pod's, got {value!r}"])
    return value


def shard_of(model_name: str, count: int) -> int:
    """The shard owning `model_name` among `count` (stable: SHA-256 of the UTF-8 name)."""
    digest = hashlib.sha256(model_name.encode()).digest()
    return int.from_bytes(digest[:8], "big") % count


def shard_index(shard: ShardConfig, replica: str | None) -> int:
    """This sizer's shard: `shard.index`, else the replica name's ordinal % count."""
    if shard.index is not None:
        return shard.index
    match = None if replica is None else _ORDINAL.fullmatch(replica)
    if match is None:
        raise ConfigError(
            [
                f"shard.index: is required when the replica name has no ordinal (-N suffix), "
                f"got replica {replica!r}"
            ]
        )
    return int(match.group(1)) % shard.count


def owned(deployments: Sequence[D], count: int, index: int) -> tuple[D, ...]:
    """The deployments of shard `index` of `count`, in their configured order."""
    return tuple(dep for dep in deployments if shard_of(dep.model_name, count) == index)


def place(config: Config, environ: Mapping[str, str]) -> tuple[Config, str | None]:
    """`config` narrowed to this sizer's shard (unchanged without a `shard` section), and its
    replica identity (None: no `sizer_replica` label)."""
    replica = replica_identity(config.replica, environ)
    if config.shard is None:
        return config, replica
    index = shard_index(config.shard, replica)
    mine = owned(config.deployments, config.shard.count, index)
    if not mine:
        models = len({dep.model_name for dep in config.deployments})
        raise ConfigError(
            [
                f"shard.index: shard {index} of {config.shard.count} owns none of the "
                f"{models} configured models: use fewer shards, got {index}"
            ]
        )
    fleet = config.fleet
    if fleet is not None:  # a model's variants share its name, so its shard: all or none here
        names = {dep.name for dep in mine}
        kept = tuple(m for m in fleet.models if set(m.variants) <= names)
        fleet = replace(fleet, models=kept) if kept else None
    shard = ShardConfig(config.shard.count, index)
    return replace(config, deployments=mine, shard=shard, fleet=fleet), replica
