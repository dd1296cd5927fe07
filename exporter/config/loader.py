"""YAML configuration -> frozen `Config`, every bad key reported at once."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from exporter.config.checks import (
    KeyReader,
    UnusableConfigError,
    address_problems,
    choice,
    file_path,
    http_url,
    integer,
    listen_address,
    number,
    read_yaml,
    string,
)
from exporter.config.fleet import (
    VARIANT_KEYS,
    Inherited,
    gpu_count_and_startup,
    parse_fleet,
)
from exporter.config.replicas import replica_bounds
from exporter.config.served_model import CV_KEYS, accelerator_preset, initial_params, model_options
from exporter.config.slo import parse_slo
from exporter.config.topology import parse_replica, parse_shard
from exporter.config.values import (
    DEFAULT_CYCLE_PERIOD_S,
    DEFAULT_LISTEN_HOST,
    DEFAULT_LISTEN_PORT,
    DEFAULT_MAX_RESPONSE_MIB,
    DEFAULT_MIN_OBSERVATIONS,
    DEFAULT_PROMETHEUS_TIMEOUT_S,
    DEFAULT_RATE_MARGIN_SIGMAS,
    DEFAULT_SCRAPE_TIMEOUT_S,
    DEFAULT_STABILIZATION_S,
    DEFAULT_WINDOW,
    MAX_CYCLE_PERIOD_S,
    MAX_DEPLOYMENTS,
    MAX_MODEL_CELLS,
    MAX_NUM_BATCHED_TOKENS,
    MAX_NUM_SEQS,
    MAX_QUEUE_SIZE,
    MAX_RATE_MARGIN_SIGMAS,
    MAX_RESPONSE_MIB,
    MAX_STABILIZATION_S,
    MAX_TIMEOUT_S,
    MAX_TUNER_WINDOW,
    MIB,
    MIN_CYCLE_PERIOD_S,
    Config,
    DeploymentConfig,
    ForecastMode,
    PrometheusConfig,
    SourceConfig,
    TunerConfig,
)
from model import ServerConfig

# Errors name the key path, the value and what is allowed, e.g.
# `deployments[1].slo.ttft_ms: must be a number > 0, got -5`.

LOG_LEVELS = ("debug", "info", "warning", "error")
# Kubernetes object names (RFC 1123 labels); the `deployment` label must match the Deployment.
NAME_PATTERN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def parse_config(data: Any, reader: KeyReader | None = None) -> Config:
    """Validate a parsed YAML document; raises ConfigError listing every problem. `reader`
    (default: a new one) keeps the problems and the rules of the keys it checked."""
    r = KeyReader() if reader is None else reader
    top = r.mapping(
        data,
        "",
        {
            "cycle_period_s",
            "listen_address",
            "state_file",
            "log_level",
            "prometheus",
            "max_response_mib",
            "deployments",
            "shard",
            "replica",
            "accelerators",
            "models",
            "fleet_plan",
        },
    )
    r.note("", "deployments", "a list of deployments (required without `models`)")
    if data is None:
        r.problems.append("(document): is empty; expected a mapping with a `deployments` list")
    period = r.get(
        top,
        "cycle_period_s",
        "",
        number(MIN_CYCLE_PERIOD_S, MAX_CYCLE_PERIOD_S, inclusive=True),
        f"must be a number >= {MIN_CYCLE_PERIOD_S:g} and <= {MAX_CYCLE_PERIOD_S:g} (seconds)",
        DEFAULT_CYCLE_PERIOD_S,
    )
    host, port = r.get(
        top,
        "listen_address",
        "",
        listen_address,
        "must be HOST:PORT with a port in 1-65535",
        (DEFAULT_LISTEN_HOST, DEFAULT_LISTEN_PORT),
    )
    state_file = r.get(top, "state_file", "", file_path, "must be a file path", None)
    log_level = r.get(
        top, "log_level", "", choice(LOG_LEVELS), f"must be one of {', '.join(LOG_LEVELS)}", "info"
    )
    max_response_mib = r.get(
        top,
        "max_response_mib",
        "",
        integer(1, MAX_RESPONSE_MIB),
        f"must be an integer >= 1 and <= {MAX_RESPONSE_MIB} (MiB)",
        DEFAULT_MAX_RESPONSE_MIB,
    )
    prometheus = _prometheus(r, top.get("prometheus"))
    lone = top.get("deployments")
    deployments = [] if lone is None and "models" in top else _deployments(r, lone, prometheus)
    fleet, variants = parse_fleet(
        r, top, lambda node, path, inherit: _deployment(r, node, path, prometheus, inherit)
    )
    _unique_names(r, deployments, variants)
    deployments += variants
    if len(deployments) > MAX_DEPLOYMENTS:
        r.problems.append(
            f"models: deployments and variants must be at most {MAX_DEPLOYMENTS} together, "
            f"got {len(deployments)}"
        )
    shard = parse_shard(r, top.get("shard"))
    replica = parse_replica(r, top)
    if r.problems:
        raise r.error()
    return Config(
        cycle_period_s=period,
        listen_host=host,
        listen_port=port,
        state_file=state_file,
        log_level=log_level,
        prometheus=prometheus,
        max_response_bytes=max_response_mib * MIB,
        deployments=tuple(deployments),
        shard=shard,
        replica=replica,
        fleet=fleet,
    )


def _unique_names(
    r: KeyReader, deployments: list[DeploymentConfig], variants: list[DeploymentConfig]
) -> None:
    """A variant is a Deployment: its name must differ from every lone deployment's."""
    lone = {dep.name for dep in deployments}
    for dep in variants:
        if dep.name in lone:
            r.fail("models", "a variant's name must differ from every deployment's", dep.name)


def load_config(path: Path, *, resolve_hosts: bool = True) -> Config:
    """Read and validate a YAML file: ConfigError listing every bad key, UnusableConfigError (one
    line) for a file that cannot be read or parsed (see config_checks.read_yaml for its bounds)
    and, with `resolve_hosts`, for a listen_address or prometheus.url host that does not exist:
    the daemon could never serve or read, so it should not start."""
    config = parse_config(read_yaml(path))
    if resolve_hosts:
        prometheus_url = None if config.prometheus is None else config.prometheus.url
        problems = address_problems(config.listen_host, config.listen_port, prometheus_url)
        if problems:
            raise UnusableConfigError(problems)
    return config


def listen_problem(config: Config, exc: OSError) -> str:
    """The line `run` prints when its HTTP server cannot listen on listen_address (the port is
    in use, the address is not local, ...), instead of a traceback."""
    reason = exc.strerror or str(exc)
    return f"listen_address {config.listen_host}:{config.listen_port}: cannot listen ({reason})"


def _prometheus(r: KeyReader, node: Any) -> PrometheusConfig | None:
    if node is None:
        return None
    path = "prometheus"
    m = r.mapping(node, path, {"url", "bearer_token_file", "ca_file", "timeout_s"})
    url = r.required(m, "url", path, http_url, "an http:// or https:// URL")
    token = r.get(m, "bearer_token_file", path, file_path, "must be a file path", None)
    ca = r.get(m, "ca_file", path, file_path, "must be a file path", None)
    timeout = r.get(
        m,
        "timeout_s",
        path,
        number(0.0, MAX_TIMEOUT_S),
        f"must be a number > 0 and <= {MAX_TIMEOUT_S:g} (seconds)",
        DEFAULT_PROMETHEUS_TIMEOUT_S,
    )
    return PrometheusConfig(url or "http://invalid", token, ca, timeout)


def _deployments(
    r: KeyReader, node: Any, prometheus: PrometheusConfig | None
) -> list[DeploymentConfig]:
    if not isinstance(node, list) or not node:
        r.fail("deployments", "must be a non-empty list of deployments", node)
        return []
    if len(node) > MAX_DEPLOYMENTS:
        r.problems.append(
            f"deployments: must hold at most {MAX_DEPLOYMENTS} deployments, got {len(node)}"
        )
        return []
    out: list[DeploymentConfig] = []
    seen: set[str] = set()
    for k, item in enumerate(node):
        dep = _deployment(r, item, f"deployments[{k}]", prometheus)
        if dep is None:
            continue
        if dep.name in seen:
            r.fail(f"deployments[{k}].name", "must be unique", dep.name)
        seen.add(dep.name)
        out.append(dep)
    return out


_DEPLOYMENT_KEYS = {
    "name",
    "model_name",
    "source",
    "server",
    "slo",
    "slo_window_s",
    "replicas",
    "scale_down_stabilization_s",
    "look_ahead_s",
    "forecaster",
    "rate_margin_sigmas",
    "initial_params",
    "accelerator",
    "tuner",
    "model",
    "scale_from_zero",
    "gpus_per_replica",
}


def _up_to(
    r: KeyReader, m: Mapping[str, Any], path: str, key: str, high: float, unit: str, default: float
) -> float:
    """An optional number in [0, high] (in `unit`)."""
    return r.get(
        m, key, path, number(0.0, high, inclusive=True),
        f"must be a number >= 0 and <= {high:g} ({unit})", default,
    )  # fmt: skip


def _deployment(
    r: KeyReader,
    node: Any,
    path: str,
    prometheus: PrometheusConfig | None,
    inherit: Inherited | None = None,
) -> DeploymentConfig | None:
    """A lone deployment, or (with `inherit`: its model's name, targets and options) a
    fleet variant."""
    before = len(r.problems)
    keys = _DEPLOYMENT_KEYS if inherit is None else VARIANT_KEYS
    m = r.mapping(node, path, keys)
    name = r.required(
        m,
        "name",
        path,
        string(NAME_PATTERN),
        "a Kubernetes name: lower-case letters, digits and '-'",
    )
    lone = inherit is None
    if lone:
        model_name = r.required(m, "model_name", path, string(), "vLLM's --served-model-name")
    source = _source(r, m.get("source"), f"{path}.source", prometheus)
    server = _server(r, m.get("server"), f"{path}.server")
    if inherit is None:
        slo = parse_slo(r, m, path)
    else:
        model_name, slo, options, pinned = inherit
    low, high, zero = replica_bounds(r, m, path, source, variant=inherit is not None)
    window = _up_to(
        r, m, path, "scale_down_stabilization_s", MAX_STABILIZATION_S, "seconds",
        DEFAULT_STABILIZATION_S,
    )  # fmt: skip
    look_ahead = r.get(
        m,
        "look_ahead_s",
        path,
        number(0.0, inclusive=True),
        "must be a number >= 0 (seconds)",
        0.0,
    )
    modes = tuple(k.value for k in ForecastMode)
    forecaster = r.get(
        m, "forecaster", path, choice(modes), f"must be one of {', '.join(modes)}",
        ForecastMode.LINEAR_TREND.value,
    )  # fmt: skip
    margin = _up_to(
        r, m, path, "rate_margin_sigmas", MAX_RATE_MARGIN_SIGMAS, "standard errors",
        DEFAULT_RATE_MARGIN_SIGMAS,
    )  # fmt: skip
    initial = initial_params(r, m.get("initial_params"), f"{path}.initial_params")
    tuner = _tuner(r, m.get("tuner"), f"{path}.tuner", server)
    if inherit is None:
        options = model_options(r, m.get("model"), f"{path}.model")
        pinned = frozenset(k for k in CV_KEYS if k in (m.get("model") or {}))
    accelerator = accelerator_preset(r, m.get("accelerator"), f"{path}.accelerator")
    gpus, startup = gpu_count_and_startup(r, m, path, variant=not lone)
    if len(r.problems) > before or name is None or model_name is None or source is None:
        return None
    return DeploymentConfig(
        name=name,
        model_name=model_name,
        source=source,
        server=server,
        slo=slo,
        min_replicas=low,
        max_replicas=high,
        scale_down_stabilization_s=window,
        look_ahead_s=look_ahead,
        forecaster=ForecastMode(forecaster),
        rate_margin_sigmas=margin,
        model=options,
        pinned_inputs=pinned,
        initial_params=initial,
        accelerator=accelerator,
        tuner=tuner,
        scale_from_zero=zero,
        gpus_per_replica=gpus,
        startup_delay_s=startup,
    )


def _source(
    r: KeyReader, node: Any, path: str, prometheus: PrometheusConfig | None
) -> SourceConfig | None:
    m = r.mapping(
        node, path, {"scrape_urls", "scrape_service", "prometheus_selector", "scrape_timeout_s"}
    )
    given = [k for k in ("scrape_urls", "scrape_service", "prometheus_selector") if k in m]
    if len(given) != 1:
        r.fail(
            path,
            "must set exactly one of scrape_urls, scrape_service, prometheus_selector",
            dict(m) if m else node,
        )
        return None
    timeout = r.get(
        m,
        "scrape_timeout_s",
        path,
        number(0.0, MAX_TIMEOUT_S),
        f"must be a number > 0 and <= {MAX_TIMEOUT_S:g} (seconds)",
        DEFAULT_SCRAPE_TIMEOUT_S,
    )
    for key, rule in (
        ("scrape_urls", "must be a non-empty list of http(s) URLs"),
        ("scrape_service", "an http:// URL whose host is a headless Service name"),
        ("prometheus_selector", "a PromQL label selector such as '{namespace=\"x\"}'"),
    ):
        r.note(path, key, f"{rule} (exactly one of the three)")
    if "scrape_urls" in m:
        urls = m["scrape_urls"]
        if not isinstance(urls, list) or not urls or any(http_url(u) is None for u in urls):
            r.fail(f"{path}.scrape_urls", "must be a non-empty list of http(s) URLs", urls)
            return None
        return SourceConfig(scrape_urls=tuple(urls), scrape_timeout_s=timeout)
    if "scrape_service" in m:
        url = r.required(
            m,
            "scrape_service",
            path,
            http_url,
            "an http:// URL whose host is a headless Service name",
        )
        return None if url is None else SourceConfig(scrape_service=url, scrape_timeout_s=timeout)
    selector = r.required(
        m,
        "prometheus_selector",
        path,
        string(),
        "a PromQL label selector such as '{namespace=\"x\"}'",
    )
    if selector is not None and prometheus is None:
        r.fail(f"{path}.prometheus_selector", "needs the top-level `prometheus` section", selector)
    return None if selector is None else SourceConfig(prometheus_selector=selector)


def _server(r: KeyReader, node: Any, path: str) -> ServerConfig:
    m = r.mapping(node, path, {"max_num_seqs", "max_num_batched_tokens", "max_queue_size"})
    seqs, tokens = (
        r.get(m, key, path, integer(1, high), f"must be an integer >= 1 and <= {high}", default)
        for key, high, default in (
            ("max_num_seqs", MAX_NUM_SEQS, 256),
            ("max_num_batched_tokens", MAX_NUM_BATCHED_TOKENS, 8192),
        )
    )
    queue = r.get(
        m,
        "max_queue_size",
        path,
        integer(0, MAX_QUEUE_SIZE),
        f"must be an integer >= 0 and <= {MAX_QUEUE_SIZE} (omit it for vLLM's unbounded queue)",
        None,
    )
    return ServerConfig(max_batch_size=seqs, max_num_batched_tokens=tokens, max_queue_size=queue)


def _tuner(r: KeyReader, node: Any, path: str, server: ServerConfig) -> TunerConfig:
    m = r.mapping(node, path, {"min_observations", "window"})
    low, window = (
        r.get(m, key, path, integer(3, MAX_TUNER_WINDOW), f"must be an integer {rule}", default)
        for key, rule, default in (
            (
                "min_observations",
                f">= 3 (three parameters) and <= {MAX_TUNER_WINDOW}",
                DEFAULT_MIN_OBSERVATIONS,
            ),
            ("window", f">= 3 and <= {MAX_TUNER_WINDOW}", DEFAULT_WINDOW),
        )
    )
    if window < low:
        r.fail(f"{path}.window", f"must be >= tuner.min_observations ({low})", window)
    cells = window * (server.max_batch_size + (server.max_queue_size or 0))
    if cells > MAX_MODEL_CELLS:
        r.problems.append(
            f"{path}.window: times (server.max_num_seqs + server.max_queue_size) must be "
            f"<= {MAX_MODEL_CELLS} (the size of a fit's model table), got {cells}"
        )
    return TunerConfig(min_observations=low, window=window)
