"""One emulated replica's HTTP endpoint: its own CollectorRegistry served at /metrics on a
loopback port by a threaded WSGI server. Ecosystem §4.3 (explicit registries)."""

from __future__ import annotations

import logging
import threading
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from exporter.testbed.emulator_metrics import ReplicaMetrics

logger = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.05  # how fast shutdown() returns


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Access logs would drown the emulator's own log."""


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class ReplicaEndpoint:
    """A replica's metrics, registry and (while it serves) HTTP server; served once only."""

    def __init__(self, metrics: ReplicaMetrics) -> None:
        self.metrics = metrics
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(metrics)
        self._httpd: _ThreadingServer | None = None
        self.url: str | None = None  # set when first served, kept after stop()

    @property
    def serving(self) -> bool:
        """Whether the HTTP server is up."""
        return self._httpd is not None

    def serve(self, host: str, port: int, name: str) -> str:
        """Start serving on host:port (0 = any free port); the /metrics URL."""
        httpd = make_server(
            host, port, make_wsgi_app(self.registry), _ThreadingServer, handler_class=_QuietHandler
        )
        threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": POLL_INTERVAL_S},
            name=name,
            daemon=True,
        ).start()
        self._httpd = httpd
        self.url = f"http://{host}:{httpd.server_port}/metrics"
        logger.info("%s serving %s", name, self.url)
        return self.url

    def stop(self) -> None:
        """Stop the HTTP server (no-op if not serving)."""
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        self._httpd = None
