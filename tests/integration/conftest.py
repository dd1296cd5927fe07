"""Integration fixtures: `start_prometheus` runs a real Prometheus server (prometheus_server.py)."""

from tests.integration.prometheus_server import start_prometheus  # noqa: F401
