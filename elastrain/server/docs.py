"""The API docs page (``/docs``) served from the package: Swagger UI is vendored, never from a CDN.

FastAPI's default ``/docs`` loads swagger-ui from jsDelivr; `create_app` turns that off
(``docs_url=None, redoc_url=None``) and calls `add_docs`, which mounts the vendored files at
``/_swagger/`` (the portal owns ``/static``) and serves the same page pointing at them.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

SWAGGER_DIR = Path(__file__).resolve().parent / "static" / "swagger"
SWAGGER_URL = "/_swagger"
DOCS_URL = "/docs"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"
# The browser loads and connects to this server only; the page's own bootstrap script is inline.
CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)


def add_docs(app: FastAPI) -> None:
    """Mount the vendored Swagger UI and register ``/docs`` (showing ``app.openapi_url``) and its OAuth2
    redirect page."""
    openapi_url = app.openapi_url or "/openapi.json"
    app.mount(SWAGGER_URL, StaticFiles(directory=str(SWAGGER_DIR)), name="swagger-static")

    @app.get(DOCS_URL, include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        page = get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} - API docs",
            swagger_js_url=f"{SWAGGER_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{SWAGGER_URL}/swagger-ui.css",
            swagger_favicon_url=f"{SWAGGER_URL}/favicon-32x32.png",
            oauth2_redirect_url=OAUTH2_REDIRECT_URL,
            # no "validate at validator.swagger.io" badge: the page talks to this server only
            swagger_ui_parameters={"validatorUrl": None},
        )
        page.headers["Content-Security-Policy"] = CSP
        page.headers["X-Content-Type-Options"] = "nosniff"
        return page

    @app.get(OAUTH2_REDIRECT_URL, include_in_schema=False)
    def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()
