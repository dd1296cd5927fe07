"""The model package's public names are pinned, and the package stays pure (no I/O imports)."""

from __future__ import annotations

import ast
from pathlib import Path

import model

CORE = {
    "Analysis",
    "Binding",
    "FirstToken",
    "LatencyMetric",
    "LatencyQuantiles",
    "PercentileTarget",
    "ReplicaPlan",
    "ServerConfig",
    "ServiceParams",
    "SizingStatus",
    "SloCapacity",
    "Workload",
    "analyze",
    "chunk_table",
    "latency_quantiles",
    "max_rate",
    "max_rate_for_slo",
    "replicas_for_slo",
}
# model/ is pure math: numpy, scipy and the standard library's non-I/O parts only.
FORBIDDEN_IMPORTS = {
    "requests",
    "prometheus_client",
    "apscheduler",
    "yaml",
    "logging",
    "time",
    "socket",
    "http",
    "urllib",
    "exporter",
    "matplotlib",
}


def test_core_names_are_exported() -> None:
    assert CORE <= set(model.__all__)
    for name in model.__all__:
        assert hasattr(model, name), name


def test_model_modules_import_no_io() -> None:
    for path in Path(model.__file__).parent.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in FORBIDDEN_IMPORTS, f"{path.name} imports {name}"
