"""The launcher's metrics relay: where rank 0's progress and `elastrain.report()` points reach the
launcher's TensorBoard writer (``elastrain run --tensorboard-dir``).

A small HTTP server on the coordinator's address, ephemeral port, that the workers learn from
``ELASTRAIN_METRICS_URL``. ``POST /points`` with ``{"points": [{"step": ..., "loss": ..., ...}, ...]}``
and the job token in ``X-Job-Token`` (as every channel of the job); anything else is refused.
"""

from __future__ import annotations

import hmac
import json
import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from elastrain.runtime.progress import RELAY_PATH

log = logging.getLogger("elastrain.run")
MAX_BODY_BYTES = 1 << 20
MAX_POINTS = 5000

PointsHandler = Callable[[list[dict[str, Any]]], None]


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], token: str, on_points: PointsHandler) -> None:
        self.token = token
        self.on_points = on_points
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        if self.path != RELAY_PATH:
            self._answer(404)
            return
        token = self.headers.get("X-Job-Token", "")
        if not hmac.compare_digest(token.encode(), self.server.token.encode()):
            self._answer(401)
            return
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if not 0 < length <= MAX_BODY_BYTES:
            self._answer(413 if length > MAX_BODY_BYTES else 400)
            return
        try:
            body = json.loads(self.rfile.read(length))
            points = body["points"]
        except (ValueError, KeyError, TypeError):
            self._answer(400)
            return
        if not isinstance(points, list) or len(points) > MAX_POINTS:
            self._answer(400)
            return
        try:
            self.server.on_points([p for p in points if isinstance(p, dict)])
        except Exception:  # a writer problem must not break the workers' reports
            log.exception("could not record the reported metrics")
            self._answer(500)
            return
        self._answer(204)

    def _answer(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a request line per report would flood the job's output."""


class MetricsRelay:
    """Receives the workers' metric points over HTTP and hands them to `on_points` (thread-safe there)."""

    def __init__(self, host: str, token: str, on_points: PointsHandler) -> None:
        self._server = _Server((host, 0), token, on_points)
        port = self._server.server_address[1]
        self.url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, name="elastrain-metrics"
        )
        self._thread.daemon = True
        self._thread.start()

    def close(self) -> None:
        """Stop serving (reports still in flight are answered first)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
