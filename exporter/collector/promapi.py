"""A small client for Prometheus's instant-query HTTP API. collector-spec §5, ecosystem §1.6.

POSTs `/api/v1/query` (form-encoded, so long selectors fit), reads the `{"status","data"}`
envelope, and returns vector or scalar results as typed samples. Sample values arrive as strings
("NaN" and "+Inf" included) and are kept as floats; callers decide what a NaN means. The bearer
token file is re-read on every request because projected service-account tokens rotate.
"""

from __future__ import annotations

import json
import logging
import math
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import urlencode

from exporter.base.errors import QUERY_SHOWN_CHARS, FailureReason, PrometheusQueryError
from exporter.collector.http_fetch import FetchError, HttpResponse, fetch
from exporter.config.values import DEFAULT_MAX_RESPONSE_BYTES

logger = logging.getLogger(__name__)

DEFAULT_QUERY_TIMEOUT_S = 10.0
QUERY_PATH = "/api/v1/query"
WARNINGS_SHOWN_CHARS = 300


@dataclass(frozen=True, slots=True)
class VectorSample:
    """One instant-vector element (or a scalar, with empty labels) at `time_s` (unix s)."""

    labels: Mapping[str, str]
    time_s: float
    value: float


class PrometheusClient:
    """Instant queries against one Prometheus (or Thanos) base URL."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = DEFAULT_QUERY_TIMEOUT_S,
        bearer_token_file: Path | None = None,
        ca_file: Path | None = None,
        insecure: bool = False,
        max_body_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        on_query: Callable[[float], None] | None = None,
    ) -> None:
        """`on_query` is told each query's wall time (s), answered or failed."""
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"`base_url` must start with http:// or https://, got {base_url!r}")
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"`timeout_s` must be a finite number > 0, got {timeout_s}")
        if insecure and ca_file is not None:
            raise ValueError("`insecure` and `ca_file` are exclusive: got both")
        self.base_url = base_url.rstrip("/")
        self._timeout_s = timeout_s
        self._token_file = bearer_token_file
        self._max_body_bytes = max_body_bytes
        self._ssl = _ssl_context(ca_file, insecure) if base_url.startswith("https://") else None
        self._warned: dict[str, str] = {}  # per query, the warnings last logged
        self._on_query = on_query

    def headers(self) -> dict[str, str]:
        """Request headers; the token is read now, trimmed, and omitted when empty."""
        if self._token_file is None:
            return {}
        try:
            token = self._token_file.read_text().strip()
        except OSError as exc:
            # A configured token file that cannot be read is a hard error, never a silent
            # anonymous request (collector-spec §5).
            raise PrometheusQueryError(
                self.base_url,
                "",
                f"cannot read bearer token file {self._token_file}: {exc}",
                reason=FailureReason.TOKEN,
            ) from exc
        return {"Authorization": f"Bearer {token}"} if token else {}

    def query(self, promql: str, *, time_s: float | None = None) -> list[VectorSample]:
        """Evaluate `promql` at `time_s` (unix s; None = the server's now)."""
        if self._on_query is None:
            return self._query(promql, time_s)
        started = time.perf_counter()
        try:
            return self._query(promql, time_s)
        finally:
            self._on_query(time.perf_counter() - started)

    def _query(self, promql: str, time_s: float | None) -> list[VectorSample]:
        form = {"query": promql}
        if time_s is not None:
            form["time"] = f"{time_s:.3f}"
        url = self.base_url + QUERY_PATH
        headers = {"Content-Type": "application/x-www-form-urlencoded", **self.headers()}
        try:
            response = fetch(
                url,
                method="POST",
                body=urlencode(form).encode(),
                headers=headers,
                deadline_s=self._timeout_s,
                max_body_bytes=self._max_body_bytes,
                ssl_context=self._ssl,
            )
        except FetchError as exc:
            raise PrometheusQueryError(url, promql, str(exc), reason=exc.reason) from exc
        body = _json_or_none(response, url, promql)
        if isinstance(body, dict) and body.get("status") == "error":
            message = f"{body.get('errorType', 'error')}: {body.get('error', '')}"
            raise PrometheusQueryError(url, promql, message, reason=FailureReason.QUERY)
        if response.status != 200:
            raise PrometheusQueryError(
                url, promql, f"HTTP {response.status}", reason=FailureReason.HTTP_STATUS
            )
        if isinstance(body, dict) and body.get("warnings"):
            line = _warnings_line(body["warnings"], promql)
            # The same warnings every cycle are one WARNING, then DEBUG lines.
            if self._warned.get(promql) == line:
                logger.debug("prometheus: %s", line)
            else:
                self._warned[promql] = line
                logger.warning("prometheus: %s", line)
        try:
            return _samples(body)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise PrometheusQueryError(
                url, promql, f"malformed response: {exc!r}", reason=FailureReason.BAD_RESPONSE
            ) from exc


def _ssl_context(ca_file: Path | None, insecure: bool) -> ssl.SSLContext:
    """Verification against the system's CAs, a given CA file, or (insecure) none."""
    context = ssl.create_default_context(cafile=None if ca_file is None else str(ca_file))
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def _json_or_none(response: HttpResponse, url: str, promql: str) -> Any:
    try:
        return json.loads(response.body)
    except ValueError:
        return None  # not JSON: the status check or the envelope check reports it
    except RecursionError as exc:  # arrays in arrays deeper than the parser's recursion
        raise PrometheusQueryError(
            url, promql, "answer nested too deeply to be a query result",
            reason=FailureReason.BAD_RESPONSE,
        ) from exc  # fmt: skip


def _warnings_line(warnings: Any, promql: str) -> str:
    """Prometheus's warnings for a query, cut to WARNINGS_SHOWN_CHARS: an answer may carry
    thousands of them."""
    listed = warnings if isinstance(warnings, list) else [warnings]
    text = "; ".join(str(w) for w in listed[:5])
    if len(text) > WARNINGS_SHOWN_CHARS:
        text = text[:WARNINGS_SHOWN_CHARS] + "..."
    shown = promql if len(promql) <= QUERY_SHOWN_CHARS else promql[:QUERY_SHOWN_CHARS] + "..."
    return f"{len(listed)} warnings for [query {shown}]: {text}"


def _samples(body: Any) -> list[VectorSample]:
    if not isinstance(body, dict) or body.get("status") != "success":
        raise ValueError("envelope without status 'success'")
    data = body["data"]
    result_type = data["resultType"]
    result = data["result"]
    if result_type == "scalar":
        return [VectorSample(MappingProxyType({}), float(result[0]), float(result[1]))]
    if result_type != "vector":
        raise ValueError(f"unsupported resultType {result_type!r}")
    samples = []
    for item in result:
        labels = item["metric"]
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise TypeError("labels must map strings to strings")
        time_s, value = item["value"]
        samples.append(VectorSample(MappingProxyType(dict(labels)), float(time_s), float(value)))
    return samples
