"""docs/reference/http-api-generated.md: the daemon's HTTP paths (from its request handler), the
what-if query's bounds and errors (from its parser) and an example answer (from the model)."""

from __future__ import annotations

import ast
import inspect
import json
from typing import Any

from exporter.config.values import DeploymentConfig, SloConfig, SourceConfig
from exporter.daemon import server
from exporter.sizing.what_if import MAX_PERCENTILE, MIN_PERCENTILE, what_if
from model import LatencyMetric, PercentileTarget, ServerConfig, ServiceParams, Workload
from tools.docs_gen.config_keys import HEADER

# Queries whose refusal the page shows, as the parser words it.
BAD_QUERIES = (
    "rate=30",
    "deployment=llama",
    "deployment=llama&rate=-1",
    "deployment=llama&rate=30&replicas=0",
    "deployment=llama&rate=30&percentiles=100",
    "deployment=llama&rate=30&speed=2",
)
EXAMPLE_QUERY = "deployment=llama&rate=30&replicas=2&percentiles=50,99"


def paths() -> list[str]:
    """The paths the request handler compares the request's path with, in its order."""
    tree = ast.parse(inspect.getsource(server))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute):
            if node.left.attr == "path":
                for right in node.comparators:
                    if isinstance(right, ast.Constant) and isinstance(right.value, str):
                        found.append(right.value)
    return found


def _round(value: Any) -> Any:
    """Floats to 4 significant digits: the page must not change with the last bits of a float."""
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, dict):
        return {k: _round(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_round(v) for v in value]
    return value


def example() -> dict[str, Any]:
    """The answer to EXAMPLE_QUERY for paper Table I's Llama-3.1-8B on an H100."""
    dep = DeploymentConfig(
        name="llama",
        model_name="meta-llama/Llama-3.1-8B-Instruct",
        source=SourceConfig(scrape_urls=("http://127.0.0.1:8000/metrics",)),
        server=ServerConfig(max_batch_size=256),
        slo=SloConfig(
            ttft_ms=200.0,
            itl_ms=30.0,
            percentiles=(PercentileTarget(LatencyMetric.TTFT, 0.95, 1000.0),),
        ),
    )
    name, rate, replicas, quantiles = server.parse_predict_query(EXAMPLE_QUERY)
    answer = what_if(
        dep, ServiceParams(6.68, 2.01e-2, 5.52e-5), Workload(1024, 256), None, rate,
        replicas or 1, quantiles,
    )  # fmt: skip
    return dict(_round(answer.to_json()))


def refusals() -> list[tuple[str, str]]:
    out = []
    for query in BAD_QUERIES:
        try:
            server.parse_predict_query(query)
        except server.QueryError as exc:
            out.append((query, json.dumps({"error": str(exc), "parameter": exc.parameter})))
    return out


def render() -> str:
    lines = [
        HEADER,
        "# HTTP API (generated)",
        "",
        "What the daemon's HTTP server answers, read from its code. The overview, with health",
        "semantics and connection limits: [HTTP endpoints](http-api.md).",
        "",
        "## Paths",
        "",
        *[f"- `{p}`" for p in paths()],
        "",
        "Any other path: 404 with `{\"error\": \"no such endpoint: ...\"}`.",
        "",
        "## `/api/v1/predict` parameters",
        "",
        "| parameter | bounds |",
        "|---|---|",
        f"| `deployment` | required; a configured deployment, at most "
        f"{server.MAX_DEPLOYMENT_CHARS} characters |",
        f"| `rate` | required; total requests per second, 0 to {server.MAX_RATE_RPS:g} |",
        f"| `replicas` | optional (default: the current count); 1 to {server.MAX_REPLICAS} |",
        f"| `percentiles` | optional; up to {server.MAX_PERCENTILES} comma-separated, "
        f"{MIN_PERCENTILE:g} to {MAX_PERCENTILE:g} |",
        "",
        "## Refusals (400)",
        "",
        "| query | answer |",
        "|---|---|",
        *[f"| `{q}` | `` {a} `` |" for q, a in refusals()],
        "",
        "An unknown deployment, or one without calibrated parameters yet: 404.",
        "",
        "## Example answer",
        "",
        f"`GET /api/v1/predict?{EXAMPLE_QUERY}` for a deployment of Llama-3.1-8B on an H100 "
        "(paper Table I parameters), 1024 prompt and 256 output tokens, targets mean TTFT 200 "
        "ms, mean ITL 30 ms and TTFT p95 1 s (figures rounded to 4 digits):",
        "",
        "```json",
        json.dumps(example(), indent=2),
        "```",
    ]
    return "\n".join(lines) + "\n"
