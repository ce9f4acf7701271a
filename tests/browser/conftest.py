"""Browser-test fixtures: a real `elastrain server` for the pages (the session's chromium, `browser`, is in
tests/conftest.py: one per test process, wherever a test drives it).

Nothing is downloaded: without /usr/bin/chromium or the playwright package the tests are skipped with
the reason (`make portal-deps` installs both). The server is the integration tests' `ControlPlane`
(free port, temp data dir, --gpus 8), stopped by PID with every container process it started;
`container_server` is the same on the container backend (podman), skipped where podman cannot run.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from elastrain.testing.containers import ContainerPlane, container_plane
from elastrain.testing.server import ControlPlane

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "artifacts" / "screenshots"
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}


@contextlib.contextmanager
def started(plane: ControlPlane) -> Iterator[ControlPlane]:
    """`plane` started; at the end its clusters are deleted, their files removed, and it is stopped by PID."""
    plane.start()
    try:
        yield plane
    finally:
        plane.cleanup()
        shutil.rmtree(plane.root / "data" / "clusters", ignore_errors=True)


@pytest.fixture(scope="module")
def server(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A real control plane for the module's tests; its clusters are deleted and it is stopped by PID."""
    with started(ControlPlane(tmp_path_factory.mktemp("portal"))) as plane:
        yield plane


@pytest.fixture(scope="module")
def container_server(
    browser: Any,
    image: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ContainerPlane]:
    """A control plane on the container backend (podman; 8 fake GPU device nodes) for the module's
    tests; skipped (with the reason) where podman cannot run containers. Its clusters are deleted, it is
    stopped by PID, and cleanup asserts that none of its containers or networks is left."""
    with container_plane(tmp_path_factory.mktemp("portal-containers")) as plane:
        yield plane


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser context (empty sessionStorage) at 1280x800; a JS error or a Content Security
    Policy violation fails the test."""
    context = browser.new_context(viewport=DESKTOP)
    tab = context.new_page()
    tab.set_default_timeout(20_000)
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.on(
        "console",
        lambda msg: errors.append(msg.text) if "Content Security Policy" in msg.text else None,
    )
    try:
        yield tab
    finally:
        context.close()
    assert not errors, f"JavaScript errors in the page: {errors}"


@pytest.fixture
def shot() -> Callable[[Any, str], Path]:
    """`shot(page, "name")` saves artifacts/screenshots/name.png (the full page) and returns its path."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def take(tab: Any, name: str) -> Path:
        path = SCREENSHOTS / f"{name}.png"
        tab.screenshot(path=str(path), full_page=True)
        return path

    return take


def sign_in(tab: Any, url: str, token: str) -> None:
    """Sign in through the form and land on the clusters list."""
    tab.goto(f"{url}/signin")
    tab.get_by_label("API token").fill(token)
    tab.get_by_role("button", name="Sign in").click()
    tab.wait_for_url(f"{url}/clusters")
