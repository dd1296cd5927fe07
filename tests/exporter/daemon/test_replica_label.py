"""The replica identity on every served series, and none without one."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.daemon.replica_label import register_start, served_registry


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("c", "a counter", ["deployment"], registry=registry).labels("d").inc(3)
    register_start(registry, 1234.5)
    return registry


def _samples(registry: CollectorRegistry) -> list[tuple[str, dict[str, str], float]]:
    text = generate_latest(registry).decode()
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def test_without_identity_the_registry_is_served_as_it_is() -> None:
    registry = _registry()
    assert served_registry(registry, None) is registry


def test_every_sample_gets_the_replica_label_and_keeps_its_value() -> None:
    registry = _registry()
    plain = _samples(registry)
    labelled = _samples(served_registry(registry, "vllm-sizer-1"))
    assert labelled == [
        (n, {**labels, "sizer_replica": "vllm-sizer-1"}, v) for n, labels, v in plain
    ]
    assert ("vllm_sizer_started_timestamp_seconds", {}, 1234.5) in plain
