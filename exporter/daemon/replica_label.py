"""The `sizer_replica` label on every served series.

Two replicas of a central sizer export the same families for the same deployments; the label is
what lets a query take each deployment's whole answer from one of them instead of mixing or
taking a max across them. Added when the series are served, so the families themselves (and
every replica-less install) stay as they are.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.metrics_core import Metric

from exporter.config.topology import REPLICA_LABEL
from exporter.daemon.metric_names import PREFIX


class _Labelled:
    """A collector that yields `inner`'s families with one more label on every sample."""

    def __init__(self, inner: CollectorRegistry, value: str) -> None:
        self._inner = inner
        self._value = value

    def describe(self) -> list[Metric]:
        return []  # registered once, on a registry of its own: nothing to check names against

    def collect(self) -> Iterator[Metric]:
        for family in self._inner.collect():
            labelled = Metric(family.name, family.documentation, family.type, family.unit)
            for sample in family.samples:
                labelled.add_sample(
                    sample.name,
                    {**sample.labels, REPLICA_LABEL: self._value},
                    sample.value,
                    sample.timestamp,
                    sample.exemplar,
                )
            yield labelled


def served_registry(registry: CollectorRegistry, replica: str | None) -> CollectorRegistry:
    """What /metrics serves: `registry` itself without a replica identity, else a view of it
    with `sizer_replica=<replica>` on every series."""
    if replica is None:
        return registry
    view = CollectorRegistry(auto_describe=False)
    view.register(_Labelled(registry, replica))
    return view


def register_start(registry: CollectorRegistry, started_s: float) -> None:
    """The unix time this sizer started, which the central-ha trigger query ranks replicas by:
    the one started first answers, so a restarted replica never takes over from a running one."""
    Gauge(
        PREFIX + "started_timestamp_seconds",
        "Unix time this sizer process started (the central-ha trigger query reads the replica "
        "started first).",
        registry=registry,
    ).set(started_s)
