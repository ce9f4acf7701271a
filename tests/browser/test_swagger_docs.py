"""``/docs`` renders in a real chromium from this server alone: Swagger UI is vendored, not from a CDN."""

from __future__ import annotations

from typing import Any

import pytest

from elastrain.testing.server import ControlPlane

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]


def test_docs_render_without_any_request_elsewhere(page: Any, server: ControlPlane) -> None:
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    answer = page.goto(f"{server.url}/docs")
    assert answer is not None and answer.status == 200 and answer.headers.get("x-request-id")
    page.locator(".swagger-ui .info .title").filter(has_text="elastrain control plane").wait_for()
    page.locator(".opblock-summary-path", has_text="/api/v1/clusters").first.wait_for()
    assert requested and all(url.startswith(server.url + "/") for url in requested), requested
    assert f"{server.url}/_swagger/swagger-ui-bundle.js" in requested
    assert f"{server.url}/openapi.json" in requested
