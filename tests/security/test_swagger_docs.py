"""``/docs`` is served from the package: the page names no CDN and every asset it loads answers here."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from elastrain.server.docs import SWAGGER_DIR
from tests.security.server_app import make_app

pytestmark = pytest.mark.timeout(60)
TYPES = {".js": "javascript", ".css": "text/css", ".png": "image/png"}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    with TestClient(make_app(tmp_path_factory.mktemp("docs")).app) as client:
        yield client


def test_docs_page_loads_nothing_from_elsewhere(client: TestClient) -> None:
    page = client.get("/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    html = page.text
    csp = page.headers["content-security-policy"]  # the browser refuses anything from elsewhere too
    assert "default-src 'self'" in csp and "connect-src 'self'" in csp and "http" not in csp
    assert not re.search(r"(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", html), "an absolute URL in /docs"
    assert "cdn" not in html.lower()
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert sorted(assets) == [
        "/_swagger/favicon-32x32.png",
        "/_swagger/swagger-ui-bundle.js",
        "/_swagger/swagger-ui.css",
    ]
    assert '"validatorUrl": null' in html  # no badge fetched from validator.swagger.io
    for url in assets:
        answer = client.get(url)
        assert answer.status_code == 200, url
        assert TYPES[Path(url).suffix] in answer.headers["content-type"], (url, answer.headers)
        assert answer.content == (SWAGGER_DIR / Path(url).name).read_bytes()
    assert b"SwaggerUIBundle" in client.get("/_swagger/swagger-ui-bundle.js").content


def test_the_spec_and_the_redirect_page_are_served_and_redoc_is_off(client: TestClient) -> None:
    assert client.get("/openapi.json").json()["info"]["title"] == "elastrain control plane"
    redirect = client.get("/docs/oauth2-redirect")
    assert redirect.status_code == 200 and "oauth2" in redirect.text.lower()
    assert client.get("/redoc").status_code == 404
    assert not any(route in client.get("/openapi.json").json()["paths"] for route in ("/docs", "/_swagger"))


def test_the_vendored_files_name_their_version_and_license() -> None:
    names = {p.name for p in SWAGGER_DIR.iterdir()}
    assert {"swagger-ui-bundle.js", "swagger-ui.css", "favicon-32x32.png", "LICENSE", "README.md"} <= names
    assert "Apache License" in (SWAGGER_DIR / "LICENSE").read_text()
    assert re.search(r"swagger-ui-dist@5\.\d+\.\d+ sha512-", (SWAGGER_DIR / "VERSIONS").read_text())
    assert not any(name.endswith(".map") for name in names)


def test_the_package_data_ships_the_vendored_files() -> None:
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["elastrain.server"]
    package_dir = SWAGGER_DIR.parents[1]
    shipped = {p for pattern in globs for p in package_dir.glob(pattern)}
    assert {p for p in SWAGGER_DIR.iterdir() if p.is_file()} <= shipped
