"""A replay's settings: the sizer's own YAML config (the deployment replayed, as it would run)
plus an optional top-level `replay:` section that `vllm-sizer run` does not read:

    replay:
      truth: {alpha_ms: 6.68, beta_ms: 0.0201, gamma_ms: 5.52e-05}  # the fleet's real parameters
      startup_delay_s: 90          # a new replica serves this long after it is asked for
      kv_capacity_tokens: 449200   # per replica
      initial_replicas: 1          # at the trace's start (default: replicas.min)
      fixed_replicas: 4            # the fixed policy's count (default: replicas.max)
      reactive: {metric: waiting, threshold: 10}   # or kv_cache, e.g. 0.8
      hpa:                         # the HPA behaviour of each autoscaled policy
        sizer: {tolerance: 0, scale_down_stabilization_s: 0}     # ours and throughput
        reactive: {tolerance: 0.1, scale_down_stabilization_s: 300}

B and M (`server`), the targets (`slo`), replicas.min/max, look_ahead_s, initial_params and the
tuner are the deployment's own. Every bad key is reported at once, by its path, as for `run`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from exporter.base.errors import ConfigError
from exporter.config.checks import KeyReader, choice, integer, number, read_yaml
from exporter.config.loader import parse_config
from exporter.config.served_model import initial_params
from exporter.config.values import MAX_REPLICAS, Config, DeploymentConfig
from exporter.replay.hpa import Behavior, PolicyKind, Rules, StepPolicy
from exporter.replay.policies import ReactiveMetric
from exporter.testbed.emulator import DEFAULT_KV_CAPACITY_TOKENS
from model.queueing.params import ServiceParams

DEFAULT_STARTUP_DELAY_S = 90.0
DEFAULT_REACTIVE_THRESHOLD = {ReactiveMetric.WAITING: 10.0, ReactiveMetric.KV_CACHE: 0.8}
MAX_STARTUP_DELAY_S = 3600.0
MAX_KV_TOKENS = 10**9
_HPA_KEYS = {
    "tolerance",
    "scale_up_stabilization_s",
    "scale_down_stabilization_s",
    "scale_up_percent",
    "scale_up_pods",
    "scale_down_percent",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplaySettings:
    """Everything a replay needs besides its arrivals and its list of policies."""

    deployment: DeploymentConfig
    window_s: float  # the config's cycle_period_s: one decision per window
    truth: ServiceParams | None  # None: not in the config (the command line may give it)
    startup_delay_s: float = DEFAULT_STARTUP_DELAY_S
    kv_capacity_tokens: int = DEFAULT_KV_CAPACITY_TOKENS
    initial_replicas: int = 1
    fixed_replicas: int = 1
    reactive_metric: ReactiveMetric = ReactiveMetric.WAITING
    reactive_threshold: float = DEFAULT_REACTIVE_THRESHOLD[ReactiveMetric.WAITING]
    sizer_behavior: Behavior
    reactive_behavior: Behavior


def load_settings(path: Path, deployment: str | None = None) -> ReplaySettings:
    """The settings in a config file; ConfigError names every bad key."""
    data = read_yaml(path)
    section: Any = None
    if isinstance(data, dict) and "replay" in data:
        data = dict(data)
        section = data.pop("replay")
    config = parse_config(data)
    return parse_replay(section, _pick(config, deployment), config.cycle_period_s)


def _pick(config: Config, name: str | None) -> DeploymentConfig:
    names = [d.name for d in config.deployments]
    if name is None:
        if len(names) > 1:
            raise ConfigError([f"deployments: the config has {len(names)} deployments "
                               f"({', '.join(names)}); choose one with --deployment"])
        dep = config.deployments[0]
    else:
        found = [d for d in config.deployments if d.name == name]
        if not found:
            raise ConfigError([f"deployments: no deployment named {name!r} "
                               f"(the config has {', '.join(names)})"])
        dep = found[0]
    # Scale to zero needs an upstream demand signal a trace does not carry: replayed from 1.
    return replace(dep, scale_from_zero=None, min_replicas=dep.serving_min_replicas)


def parse_replay(node: Any, dep: DeploymentConfig, window_s: float) -> ReplaySettings:
    """The `replay:` section (None: every default) for deployment `dep`."""
    r = KeyReader()
    path = "replay"
    m = r.mapping(node, path, {"truth", "startup_delay_s", "kv_capacity_tokens",
                               "initial_replicas", "fixed_replicas", "reactive", "hpa"})
    truth = initial_params(r, m.get("truth"), f"{path}.truth")
    delay = r.get(m, "startup_delay_s", path, number(0.0, MAX_STARTUP_DELAY_S, inclusive=True),
                  f"must be a number >= 0 and <= {MAX_STARTUP_DELAY_S:g} (seconds)",
                  DEFAULT_STARTUP_DELAY_S)
    kv = r.get(m, "kv_capacity_tokens", path, integer(1, MAX_KV_TOKENS),
               f"must be an integer >= 1 and <= {MAX_KV_TOKENS}", DEFAULT_KV_CAPACITY_TOKENS)
    bounds = f"must be an integer >= {dep.min_replicas} and <= {dep.max_replicas} (replicas)"
    within = integer(dep.min_replicas, dep.max_replicas)
    initial = r.get(m, "initial_replicas", path, within, bounds, dep.min_replicas)
    fixed = r.get(m, "fixed_replicas", path, integer(1, MAX_REPLICAS),
                  f"must be an integer >= 1 and <= {MAX_REPLICAS}", dep.max_replicas)
    reactive = r.mapping(m.get("reactive"), f"{path}.reactive", {"metric", "threshold"})
    metrics = tuple(x.value for x in ReactiveMetric)
    metric = ReactiveMetric(r.get(reactive, "metric", f"{path}.reactive", choice(metrics),
                                  f"must be one of {', '.join(metrics)}",
                                  ReactiveMetric.WAITING.value))
    threshold = r.get(reactive, "threshold", f"{path}.reactive", number(0.0),
                      "must be a number > 0 (per replica)", DEFAULT_REACTIVE_THRESHOLD[metric])
    hpa = r.mapping(m.get("hpa"), f"{path}.hpa", {"sizer", "reactive"})
    sizer = _behavior(r, hpa.get("sizer"), f"{path}.hpa.sizer",
                      Behavior.shipped(dep.max_replicas))
    reactive_hpa = _behavior(r, hpa.get("reactive"), f"{path}.hpa.reactive",
                             Behavior.kubernetes_default())
    if r.problems:
        raise r.error()
    return ReplaySettings(
        deployment=dep, window_s=window_s, truth=truth, startup_delay_s=delay,
        kv_capacity_tokens=kv, initial_replicas=initial, fixed_replicas=fixed,
        reactive_metric=metric, reactive_threshold=threshold,
        sizer_behavior=sizer, reactive_behavior=reactive_hpa,
    )  # fmt: skip


def _behavior(r: KeyReader, node: Any, path: str, default: Behavior) -> Behavior:
    """A behaviour from its flat keys, each defaulting to `default`'s."""
    m = r.mapping(node, path, _HPA_KEYS)
    up, down = default.scale_up, default.scale_down
    seconds = number(0.0, 3600.0, inclusive=True)
    tolerance = r.get(m, "tolerance", path, number(0.0, 1.0, inclusive=True),
                      "must be a number >= 0 and <= 1", up.tolerance)
    up_s = r.get(m, "scale_up_stabilization_s", path, seconds,
                 "must be a number >= 0 and <= 3600 (seconds)", up.stabilization_s)
    down_s = r.get(m, "scale_down_stabilization_s", path, seconds,
                   "must be a number >= 0 and <= 3600 (seconds)", down.stabilization_s)
    percent = integer(1, 10_000)
    up_pct = r.get(m, "scale_up_percent", path, percent, "must be an integer >= 1 and <= 10000",
                   _step(up, PolicyKind.PERCENT))
    up_pods = r.get(m, "scale_up_pods", path, integer(1, MAX_REPLICAS),
                    f"must be an integer >= 1 and <= {MAX_REPLICAS}", _step(up, PolicyKind.PODS))
    down_pct = r.get(m, "scale_down_percent", path, integer(1, 100),
                     "must be an integer >= 1 and <= 100", _step(down, PolicyKind.PERCENT))
    return Behavior(
        scale_up=Rules(stabilization_s=up_s, tolerance=tolerance,
                       policies=(StepPolicy(PolicyKind.PERCENT, up_pct),
                                 StepPolicy(PolicyKind.PODS, up_pods))),
        scale_down=Rules(stabilization_s=down_s, tolerance=tolerance,
                         policies=(StepPolicy(PolicyKind.PERCENT, down_pct),)),
    )


def _step(rules: Rules, kind: PolicyKind) -> int:
    return next((p.value for p in rules.policies if p.kind is kind), 100)
