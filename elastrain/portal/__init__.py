"""The web portal: server-rendered pages (Jinja2) plus small plain JS that calls the public REST API.

`mount_portal` is the one hook the server calls (at the end of `create_app`); nothing happens at
import time. The pages carry no data themselves: the browser keeps the API token in
``sessionStorage`` and every page fetches what it shows from ``/api/v1``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI

    from elastrain.server.jobs import JobService
    from elastrain.server.services import Services


def mount_portal(app: FastAPI, services: Services | None = None, jobs: JobService | None = None) -> None:
    """Serve the portal at ``/`` (pages and static files); with `services`/`jobs` also the browser-only
    API routes: the job metrics history and the launcher-terminal WebSocket."""
    from elastrain.portal.pages import add_pages

    add_pages(app)
    if services is not None and jobs is not None:
        from elastrain.portal.api import add_portal_api

        add_portal_api(app, services, jobs)
