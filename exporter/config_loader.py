"""YAML configuration -> frozen `Config`, every bad key reported at once."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from exporter.config import (
    DEFAULT_CYCLE_PERIOD_S,
    DEFAULT_LISTEN_HOST,
    DEFAULT_LISTEN_PORT,
    DEFAULT_MIN_OBSERVATIONS,
    DEFAULT_PROMETHEUS_TIMEOUT_S,
    DEFAULT_SCRAPE_TIMEOUT_S,
    DEFAULT_STABILIZATION_S,
    DEFAULT_WINDOW,
    Config,
    DeploymentConfig,
    PrometheusConfig,
    SloConfig,
    SourceConfig,
    TunerConfig,
)
from exporter.config_checks import (
    KeyReader,
    choice,
    file_path,
    http_url,
    integer,
    number,
    string,
)
from exporter.errors import ConfigError
from model import ArchitectureSpec, ModelOptions, ModelVariant, ServerConfig, ServiceParams

# Errors name the key path, the value and what is allowed, e.g.
# `deployments[1].slo.ttft_ms: must be a number > 0, got -5`.

LOG_LEVELS = ("debug", "info", "warning", "error")
# Kubernetes object names (RFC 1123 labels); the `deployment` label must match the Deployment.
NAME_PATTERN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def _listen(value: Any) -> tuple[str, int] | None:
    if not isinstance(value, str):
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host.strip("[]") or DEFAULT_LISTEN_HOST, int(port)


def parse_config(data: Any) -> Config:
    """Validate a parsed YAML document; raises ConfigError listing every problem."""
    r = KeyReader()
    top = r.mapping(
        data,
        "",
        {
            "cycle_period_s",
            "listen_address",
            "state_file",
            "log_level",
            "prometheus",
            "deployments",
        },
    )
    if data is None:
        r.problems.append("(document): is empty; expected a mapping with a `deployments` list")
    period = r.get(
        top,
        "cycle_period_s",
        "",
        number(1.0, inclusive=True),
        "must be a number >= 1 (seconds)",
        DEFAULT_CYCLE_PERIOD_S,
    )
    host, port = r.get(
        top,
        "listen_address",
        "",
        _listen,
        "must be HOST:PORT with a port in 1-65535",
        (DEFAULT_LISTEN_HOST, DEFAULT_LISTEN_PORT),
    )
    state_file = r.get(top, "state_file", "", file_path, "must be a file path", None)
    log_level = r.get(
        top, "log_level", "", choice(LOG_LEVELS), f"must be one of {', '.join(LOG_LEVELS)}", "info"
    )
    prometheus = _prometheus(r, top.get("prometheus"))
    deployments = _deployments(r, top.get("deployments"), prometheus)
    if r.problems:
        raise ConfigError(r.problems)
    return Config(
        cycle_period_s=period,
        listen_host=host,
        listen_port=port,
        state_file=state_file,
        log_level=log_level,
        prometheus=prometheus,
        deployments=tuple(deployments),
    )


def load_config(path: Path) -> Config:
    """Read and validate a YAML file; ConfigError for an unreadable or invalid file."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read the file ({exc.strerror})"]) from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path}: not valid YAML ({exc})"]) from exc
    return parse_config(data)


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
        number(0.0),
        "must be a number > 0 (seconds)",
        DEFAULT_PROMETHEUS_TIMEOUT_S,
    )
    return PrometheusConfig(url or "http://invalid", token, ca, timeout)


def _deployments(
    r: KeyReader, node: Any, prometheus: PrometheusConfig | None
) -> list[DeploymentConfig]:
    if not isinstance(node, list) or not node:
        r.fail("deployments", "must be a non-empty list of deployments", node)
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
    "replicas",
    "scale_down_stabilization_s",
    "look_ahead_s",
    "initial_params",
    "tuner",
    "model",
}


def _deployment(
    r: KeyReader, node: Any, path: str, prometheus: PrometheusConfig | None
) -> DeploymentConfig | None:
    before = len(r.problems)
    m = r.mapping(node, path, _DEPLOYMENT_KEYS)
    name = r.required(
        m,
        "name",
        path,
        string(NAME_PATTERN),
        "a Kubernetes name: lower-case letters, digits and '-'",
    )
    model_name = r.required(m, "model_name", path, string(), "vLLM's --served-model-name")
    source = _source(r, m.get("source"), f"{path}.source", prometheus)
    server = _server(r, m.get("server"), f"{path}.server")
    slo = _slo(r, m.get("slo"), f"{path}.slo")
    rep = r.mapping(m.get("replicas"), f"{path}.replicas", {"min", "max"})
    low = r.get(rep, "min", f"{path}.replicas", integer(1), "must be an integer >= 1", 1)
    high = r.get(rep, "max", f"{path}.replicas", integer(1), "must be an integer >= 1", 10)
    if high < low:
        r.fail(f"{path}.replicas.max", f"must be >= replicas.min ({low})", high)
    window = r.get(
        m,
        "scale_down_stabilization_s",
        path,
        number(0.0, inclusive=True),
        "must be a number >= 0 (seconds)",
        DEFAULT_STABILIZATION_S,
    )
    look_ahead = r.get(
        m,
        "look_ahead_s",
        path,
        number(0.0, inclusive=True),
        "must be a number >= 0 (seconds)",
        0.0,
    )
    initial = _initial_params(r, m.get("initial_params"), f"{path}.initial_params")
    tuner_node = r.mapping(m.get("tuner"), f"{path}.tuner", {"min_observations", "window"})
    tuner = TunerConfig(
        min_observations=r.get(
            tuner_node,
            "min_observations",
            f"{path}.tuner",
            integer(3),
            "must be an integer >= 3 (three parameters)",
            DEFAULT_MIN_OBSERVATIONS,
        ),
        window=r.get(
            tuner_node,
            "window",
            f"{path}.tuner",
            integer(3),
            "must be an integer >= 3",
            DEFAULT_WINDOW,
        ),
    )
    if tuner.window < tuner.min_observations:
        r.fail(
            f"{path}.tuner.window",
            f"must be >= tuner.min_observations ({tuner.min_observations})",
            tuner.window,
        )
    options = _model_options(r, m.get("model"), f"{path}.model")
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
        model=options,
        initial_params=initial,
        tuner=tuner,
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
        number(0.0),
        "must be a number > 0 (seconds)",
        DEFAULT_SCRAPE_TIMEOUT_S,
    )
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
    seqs = r.get(m, "max_num_seqs", path, integer(1), "must be an integer >= 1", 256)
    tokens = r.get(m, "max_num_batched_tokens", path, integer(1), "must be an integer >= 1", 8192)
    queue = r.get(
        m,
        "max_queue_size",
        path,
        integer(0),
        "must be an integer >= 0 (omit it for vLLM's unbounded queue)",
        None,
    )
    return ServerConfig(max_batch_size=seqs, max_num_batched_tokens=tokens, max_queue_size=queue)


def _slo(r: KeyReader, node: Any, path: str) -> SloConfig:
    m = r.mapping(node, path, {"ttft_ms", "itl_ms"})
    ttft = r.get(m, "ttft_ms", path, number(0.0), "must be a number > 0 (ms)", None)
    itl = r.get(m, "itl_ms", path, number(0.0), "must be a number > 0 (ms)", None)
    return SloConfig(ttft, itl)


def _initial_params(r: KeyReader, node: Any, path: str) -> ServiceParams | None:
    if node is None:
        return None
    m = r.mapping(node, path, {"alpha_ms", "beta_ms", "gamma_ms"})
    values = [
        r.required(m, key, path, number(0.0), "a number > 0 (ms)")
        for key in ("alpha_ms", "beta_ms", "gamma_ms")
    ]
    alpha, beta, gamma = values
    if alpha is None or beta is None or gamma is None:
        return None
    return ServiceParams(alpha, beta, gamma)


def _model_options(r: KeyReader, node: Any, path: str) -> ModelOptions:
    if node is None:
        return ModelOptions()
    keys = {"variant", "arrival_cv", "input_length_cv", "output_length_cv", "architecture"}
    m = r.mapping(node, path, keys)
    variants = tuple(v.value for v in ModelVariant)
    default = ModelOptions()
    variant = r.get(
        m,
        "variant",
        path,
        choice(variants),
        f"must be one of {', '.join(variants)}",
        default.variant.value,
    )
    cvs = {
        key: r.get(
            m,
            key,
            path,
            number(0.0, inclusive=True),
            "must be a number >= 0 (a coefficient of variation)",
            getattr(default, key),
        )
        for key in ("arrival_cv", "input_length_cv", "output_length_cv")
    }
    architecture = None
    if m.get("architecture") is not None:
        apath = f"{path}.architecture"
        a = r.mapping(m["architecture"], apath, {"num_layers", "hidden_size", "num_parameters"})
        layers = r.required(a, "num_layers", apath, integer(1), "an integer >= 1")
        hidden = r.required(a, "hidden_size", apath, integer(1), "an integer >= 1")
        params = r.required(a, "num_parameters", apath, number(0.0), "a number > 0")
        if layers is not None and hidden is not None and params is not None:
            architecture = ArchitectureSpec(layers, hidden, params)
    return ModelOptions(variant=ModelVariant(variant), architecture=architecture, **cvs)
