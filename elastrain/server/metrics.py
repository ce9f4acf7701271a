"""``GET /metrics``: the server's Prometheus metrics, every name prefixed ``elastrain_``.

Each app has its own registry (several servers in one process never collide) holding:

* `metrics_collectors.ControlPlaneCollector` and `metrics_collectors.UsageCollector`, which read the
  database, the backend and NVML at scrape time;
* the reconciler's pass-duration histogram and failure counter (`metrics_stats.ReconcileStats`);
* the HTTP metrics of prometheus-fastapi-instrumentator (``elastrain_http_*``, by route template).

With a metrics token configured (``--metrics-token`` / ``ELASTRAIN_METRICS_TOKEN``) a scrape without
``Authorization: Bearer TOKEN`` is a 401; without one, /metrics is open, as most exporters are (the
server listens on 127.0.0.1 by default, and its series carry no more than cluster names and job ids).
"""

from __future__ import annotations

import hmac

from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_fastapi_instrumentator import Instrumentator

from elastrain.server.errors import Unauthorized
from elastrain.server.limits import bearer_token
from elastrain.server.metrics_collectors import ControlPlaneCollector, UsageCollector
from elastrain.server.services import Services
from elastrain.server.usage_service import UsageService

METRICS_PATH = "/metrics"


def metrics_registry(services: Services, usage: UsageService) -> CollectorRegistry:
    """A registry of every elastrain collector (HTTP metrics are added by `install`)."""
    registry = CollectorRegistry()
    reconciler = services.reconciler
    registry.register(ControlPlaneCollector(services.db, services.inventory, reconciler.scheduler))
    registry.register(UsageCollector(services.db, usage))
    for collector in reconciler.stats.collectors():
        registry.register(collector)
    return registry


def install(app: FastAPI, services: Services, usage: UsageService, token: str | None) -> CollectorRegistry:
    """Serve ``GET /metrics`` on `app` and count its requests; `token`: the bearer token a scrape
    needs (None: none)."""
    registry = metrics_registry(services, usage)
    Instrumentator(
        should_group_status_codes=True,
        should_ignore_untemplated=True,  # unknown paths (scanners) add no series
        excluded_handlers=[f"^{METRICS_PATH}$"],
        registry=registry,
    ).instrument(app, metric_namespace="elastrain")

    def metrics(request: Request) -> Response:
        """Prometheus text format (401 without the metrics token, when one is configured)."""
        if token is not None:
            given = bearer_token(request.headers)
            if given is None or not hmac.compare_digest(given.encode(), token.encode()):
                raise Unauthorized(
                    "GET /metrics needs the metrics token: send `Authorization: Bearer TOKEN` (the "
                    "server's --metrics-token / ELASTRAIN_METRICS_TOKEN; in Prometheus, `authorization: "
                    "{credentials_file: ...}` in the scrape config)"
                )
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app.add_api_route(METRICS_PATH, metrics, methods=["GET"], include_in_schema=False)
    app.state.metrics_registry = registry
    return registry
