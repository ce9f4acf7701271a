"""Fixtures of the API contract tests: the published schema and a live `elastrain server` per module.

The server is the control-plane harness of the integration tests (`ControlPlane`: a real server process
on a free port, SQLite, the process backend with host commands allowed on purpose, no GPUs); its
cleanup deletes every cluster through the API, stops the server by PID and kills leftover container
processes by PID.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from elastrain.testing.server import ControlPlane

REPO = Path(__file__).resolve().parents[2]
PUBLISHED = REPO / "docs" / "openapi.json"
EXPORT_SCRIPT = REPO / "scripts" / "export_openapi.py"


def export_script() -> ModuleType:
    """``scripts/export_openapi.py`` as a module (its `render` is the one canonical file layout)."""
    spec = importlib.util.spec_from_file_location("export_openapi", EXPORT_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A started `elastrain server` (process backend, ``--gpus 0``); stopped and cleaned up after."""
    plane = ControlPlane(tmp_path_factory.mktemp("contract"), gpus=0)
    try:
        plane.start()
        yield plane
    finally:
        plane.cleanup()
