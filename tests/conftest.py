"""Fixtures shared across the suites, built on the shipped harness (`elastrain.testing`).

- `postgres`: one private PostgreSQL per session (skipped with the reason when its tools are missing:
  nothing is installed from a test);
- `cp`: one `elastrain server` per database kind (SQLite; PostgreSQL under the `postgres` mark);
- `image` and `ccp`: the container backend's pytorch image and a server on it (skipped without podman).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elastrain.testing.containers import ContainerPlane, container_plane, framework_image
from elastrain.testing.postgres import Postgres, ToolMissing
from elastrain.testing.processes import kill_pids
from elastrain.testing.server import ControlPlane


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """A private PostgreSQL server for the session."""
    try:
        server = Postgres()
    except ToolMissing as exc:
        pytest.skip(str(exc))
    yield server
    server.stop()


@pytest.fixture(scope="session", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def cp(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A started server on the process backend (8 virtual GPUs), one per database kind; cleaned up
    (every cluster deleted, no container process left) at the end of the session."""
    db_url = request.getfixturevalue("postgres").new_database() if request.param == "postgres" else None
    plane = ControlPlane(tmp_path_factory.mktemp(f"cp-{request.param}"), db_url)
    plane.start()
    yield plane
    plane.cleanup()


@pytest.fixture(scope="session")
def image() -> str:
    """The pytorch image, built once per session (a no-op when its inputs did not change)."""
    return framework_image("pytorch")


@pytest.fixture(scope="module")
def ccp(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ContainerPlane]:
    """A server on the container backend with 8 fake GPUs."""
    with container_plane(tmp_path_factory.mktemp("ccp")) as plane:
        yield plane


CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _descendants(root: int) -> list[int]:
    """PIDs of every living process below `root` (from /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _is_browser_process(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().lower()
    except OSError:
        return False
    return b"chrom" in argv or b"playwright" in argv


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """One headless chromium for the session; at the end it is closed and any process left of the
    Playwright driver or chromium (our descendants only) is killed by PID."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: `make portal-deps` (apt-get install chromium) installs it")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright for Python is not installed: `make install` (dev extra) installs it")
    before = set(_descendants(os.getpid()))
    try:
        with sync_playwright() as pw:
            chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
            try:
                yield chromium
            finally:
                chromium.close()
    finally:
        kill_pids(p for p in set(_descendants(os.getpid())) - before if _is_browser_process(p))
