"""The I/O a configuration asks for: each deployment's vLLM source and demand query.

One Prometheus client serves them all; Prometheus sources read in batches (prom_batch.py)."""

from __future__ import annotations

from collections.abc import Callable

from exporter.base.clock import Clock
from exporter.collector.demand import DemandSource
from exporter.collector.prom_batch import PrometheusBatch
from exporter.collector.promapi import PrometheusClient
from exporter.collector.sources import (
    DEFAULT_POD_LABEL,
    PrometheusSource,
    ScrapeSource,
    Source,
)
from exporter.config.values import Config

# Deployments per batched query. A vLLM 0.32 pod has 117 series the sizer reads (10.5 KB of
# exposition text); as Prometheus JSON with the target's labels, about 230 bytes each: some 27 KB
# per pod, so 100 deployments of 2 pods answer about 5-6 MB, well inside the 32 MiB response cap
# (max_response_mib), where 1,000 in one answer (about 54 MB) would fail whole.
BATCH_DEPLOYMENTS = 100


def prometheus_client(
    config: Config, on_query: Callable[[float], None] | None = None
) -> PrometheusClient | None:
    """The client of the `prometheus` section (None without one); `on_query` is told each
    query's wall time (s)."""
    if config.prometheus is None:
        return None
    return PrometheusClient(
        config.prometheus.url,
        timeout_s=config.prometheus.timeout_s,
        bearer_token_file=config.prometheus.bearer_token_file,
        ca_file=config.prometheus.ca_file,
        max_body_bytes=config.max_response_bytes,
        on_query=on_query,
    )


def build_sources(
    config: Config, clock: Clock, client: PrometheusClient | None = None
) -> dict[str, Source]:
    """One source per deployment, from its `source` section; `client` (default: a new one from
    the `prometheus` section) serves the Prometheus sources."""
    client = client or prometheus_client(config)
    sources: dict[str, Source] = {}
    for dep in config.deployments:
        src = dep.source
        if src.prometheus_selector is not None:
            assert client is not None  # config validation guarantees the prometheus section
            sources[dep.name] = PrometheusSource(
                client=client,
                clock=clock,
                selector=src.prometheus_selector,
                model_name=dep.model_name,
            )
        else:
            sources[dep.name] = ScrapeSource(
                clock=clock,
                urls=src.scrape_urls,
                service_url=src.scrape_service,
                model_name=dep.model_name,
                timeout_s=src.scrape_timeout_s,
                max_body_bytes=config.max_response_bytes,
            )
    _batch_prometheus_reads(sources, clock, client)
    return sources


def _batch_prometheus_reads(
    sources: dict[str, Source], clock: Clock, client: PrometheusClient | None
) -> None:
    """Every Prometheus source reads its part of one query per cycle (prom_batch.py), at most
    BATCH_DEPLOYMENTS deployments to a query."""
    prom = {name: s for name, s in sources.items() if isinstance(s, PrometheusSource)}
    if not prom or client is None:
        return
    names = sorted(prom)
    for start in range(0, len(names), BATCH_DEPLOYMENTS):
        chunk = names[start : start + BATCH_DEPLOYMENTS]
        batch = PrometheusBatch(
            client=client,
            clock=clock,
            selectors={name: prom[name].series_query for name in chunk},
            pod_label=DEFAULT_POD_LABEL,
        )
        for name in chunk:
            prom[name].batch = (batch, name)


def build_demand_sources(
    config: Config, client: PrometheusClient | None = None
) -> dict[str, DemandSource]:
    """One demand source per deployment with scale_from_zero (config validation guarantees
    the prometheus section for them); `client` as for build_sources."""
    client = client or prometheus_client(config)
    return {
        dep.name: DemandSource(client=client, query=dep.scale_from_zero.demand_query)
        for dep in config.deployments
        if dep.scale_from_zero is not None and client is not None
    }


def build_inventory_sources(
    config: Config, client: PrometheusClient | None = None
) -> dict[str, DemandSource]:
    """One query per accelerator type whose inventory is a query (a `models` section), by
    type; `client` as for build_sources (a query needs the prometheus section)."""
    client = client or prometheus_client(config)
    if config.fleet is None or client is None:
        return {}
    return {
        a.name.value: DemandSource(client=client, query=a.inventory_query, what="inventory")
        for a in config.fleet.accelerators
        if a.inventory_query is not None
    }
