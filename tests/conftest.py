"""Fixtures shared across the suites, built on the shipped harness (`elastrain.testing`).

- `postgres`: one private PostgreSQL per session (skipped with the reason when its tools are missing:
  nothing is installed from a test);
- `cp`: one `elastrain server` per database kind (SQLite; PostgreSQL under the `postgres` mark);
- `image` and `ccp`: the container backend's pytorch image and a server on it (skipped without podman).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from elastrain.testing.containers import ContainerPlane, container_plane, framework_image
from elastrain.testing.postgres import Postgres, ToolMissing
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
