"""The Prometheus ``/metrics`` HTTP server a Halcyon gRPC host runs on its own port.

What it decides: one registry's text exposition served from a daemon thread (a threading WSGI
server, quiet request logs, a short poll interval so closing returns promptly), so scraping
never runs on the host's event loop. :class:`common.serving.ServiceHost` starts and closes it.
"""

from __future__ import annotations

import socket
import threading
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from common.serving_options import parse_hostport


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _MetricsHttpServer:
    """Prometheus text exposition of one registry on its own port, in a daemon thread."""

    def __init__(self, listen: str, registry: CollectorRegistry) -> None:
        host, port = parse_hostport(listen)

        class Server(_ThreadingWSGIServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        self._httpd = make_server(
            host, port, make_wsgi_app(registry), Server, handler_class=_QuietHandler
        )
        self.host = host
        self.port: int = self._httpd.server_address[1]
        # A short poll interval so stop() returns promptly.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"metrics-http-{self.port}",
            daemon=True,
        )
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
