"""The web portal: server-rendered pages (Jinja2) plus small plain JS that calls the public REST API.

`mount_portal` is the one hook the server calls (at the end of `create_app`); nothing happens at
import time. The pages carry no data themselves: the browser keeps the API token in
``sessionStorage`` and every page fetches what it shows from ``/api/v1``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI


def mount_portal(app: FastAPI, api: bool = True) -> None:
    """Serve the portal at ``/`` (pages and static files); with `api` also the browser-only API routes
    (the job metrics history and the launcher-terminal WebSocket) and the launcher's JupyterLab behind
    ``/clusters/{name}/lab/``, which find the server's services on ``app.state`` (`elastrain.server.deps`)."""
    from elastrain.portal.pages import add_pages

    add_pages(app)
    if api:
        from elastrain.portal.api import add_portal_api
        from elastrain.portal.lab_proxy import add_lab_proxy

        add_portal_api(app)
        add_lab_proxy(app)
