"""The daemon's one HTTP server: /metrics, /healthz, /readyz and /api/v1/predict.

Binds only to the configured address; no endpoint changes state. JSON uses seconds
(units are converted only here and in exposition.py).
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

logger = logging.getLogger(__name__)

S_PER_MS = 1e-3


@dataclass(frozen=True, slots=True, kw_only=True)
class WhatIf:
    """A what-if prediction for one deployment at a given total rate; ms and req/s."""

    deployment: str
    total_rate_rps: float
    replicas: int
    per_replica_rate_rps: float
    ttft_ms: float
    itl_ms: float
    stable: bool
    max_rate_per_replica_rps: float
    saturation_rate_per_replica_rps: float
    replicas_needed: int | None
    feasible: bool
    params: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        """JSON-safe, in seconds; an unstable prediction's latencies are null."""

        def seconds(ms: float) -> float | None:
            return ms * S_PER_MS if math.isfinite(ms) else None

        return {
            "deployment": self.deployment,
            "rate_requests_per_second": self.total_rate_rps,
            "replicas": self.replicas,
            "per_replica_rate_requests_per_second": self.per_replica_rate_rps,
            "stable": self.stable,
            "ttft_seconds": seconds(self.ttft_ms),
            "itl_seconds": seconds(self.itl_ms),
            "max_rate_per_replica_requests_per_second": self.max_rate_per_replica_rps,
            "saturation_rate_per_replica_requests_per_second": self.saturation_rate_per_replica_rps,
            "replicas_needed": self.replicas_needed,
            "slo_feasible": self.feasible,
            "params_seconds": {k.removesuffix("_ms"): v * S_PER_MS for k, v in self.params.items()},
        }


class QueryError(ValueError):
    """A bad query parameter; `parameter` names it."""

    def __init__(self, parameter: str, message: str) -> None:
        self.parameter = parameter
        super().__init__(f"query parameter `{parameter}`: {message}")


# (deployment, total rate req/s, replicas or None = current) -> WhatIf; raises QueryError or
# LookupError (unknown deployment / no parameters yet).
Predictor = Callable[[str, float, int | None], WhatIf]


def parse_predict_query(query: str) -> tuple[str, float, int | None]:
    """deployment, rate (req/s, >= 0) and optional replicas (>= 1) from a query string."""
    params = parse_qs(query, keep_blank_values=True)
    for name, values in params.items():
        if name not in ("deployment", "rate", "replicas"):
            raise QueryError(name, "unknown (allowed: deployment, rate, replicas)")
        if len(values) != 1:
            raise QueryError(name, "given more than once")
    if "deployment" not in params or not params["deployment"][0]:
        raise QueryError("deployment", "is required")
    if "rate" not in params:
        raise QueryError("rate", "is required (requests per second)")
    raw_rate = params["rate"][0]
    try:
        rate = float(raw_rate)
    except ValueError:
        raise QueryError("rate", f"must be a number >= 0, got {raw_rate!r}") from None
    if not math.isfinite(rate) or rate < 0:
        raise QueryError("rate", f"must be a number >= 0, got {raw_rate!r}")
    replicas: int | None = None
    if "replicas" in params:
        raw = params["replicas"][0]
        if not raw.isdigit() or int(raw) < 1:
            raise QueryError("replicas", f"must be an integer >= 1, got {raw!r}")
        replicas = int(raw)
    return params["deployment"][0], rate, replicas


class SizerHTTPServer:
    """Serves the registry and the daemon's health and what-if API on one address."""

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        ready: Callable[[], bool],
        predictor: Predictor,
    ) -> None:
        handler = _handler_class(registry, ready, predictor)
        self._httpd = ThreadingHTTPServer((host, port), handler)
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="vllm-sizer-http", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _handler_class(
    registry: CollectorRegistry, ready: Callable[[], bool], predictor: Predictor
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "vllm-sizer"

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            url = urlsplit(self.path)
            if url.path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif url.path == "/healthz":
                self._text(200, "ok\n")
            elif url.path == "/readyz":
                if ready():
                    self._text(200, "ready\n")
                else:
                    self._text(503, "not ready: no successful cycle recently\n")
            elif url.path == "/api/v1/predict":
                self._predict(url.query)
            else:
                self._json(404, {"error": f"no such endpoint: {url.path}"})

        def _predict(self, query: str) -> None:
            try:
                deployment, rate, replicas = parse_predict_query(query)
                result = predictor(deployment, rate, replicas)
            except QueryError as exc:
                self._json(400, {"error": str(exc), "parameter": exc.parameter})
            except LookupError as exc:
                self._json(404, {"error": str(exc.args[0] if exc.args else exc)})
            else:
                self._json(200, result.to_json())

        def _text(self, status: int, body: str) -> None:
            self._send(status, body.encode(), "text/plain; charset=utf-8")

        def _json(self, status: int, body: dict[str, Any]) -> None:
            self._send(status, json.dumps(body).encode(), "application/json")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            logger.debug("http: " + format, *args)

    return Handler
