"""The control plane's app in process: `create_app` on real services, for TestClient tests and
`make openapi` (SQLite in a temp dir, the process backend, no GPUs; nothing started, no port opened)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI


@dataclass
class AppUnderTest:
    """The app and the admin's token."""

    app: FastAPI
    token: str


def make_app(root: Path, *, max_body_bytes: int | None = None, gpus: int | str = 0) -> AppUnderTest:
    """`create_app` wired to real services on `root` (no reconciler thread, no API relay); `gpus`:
    the virtual GPUs, a count or ``MODEL:N,...``."""
    from elastrain.backends.local import LocalBackend
    from elastrain.db.session import Database
    from elastrain.server.app import create_app
    from elastrain.server.inventory import Inventory
    from elastrain.server.jobs import JobService
    from elastrain.server.main import bootstrap_admin
    from elastrain.server.membership import JobMembership
    from elastrain.server.reconciler import Reconciler
    from elastrain.server.services import Services
    from elastrain.server.storage import StorageAreas

    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    db = Database(f"sqlite:///{data / 'elastrain.db'}")
    db.migrate()
    token = bootstrap_admin(db, data)
    assert token
    backend = LocalBackend(data)
    inventory = Inventory.create(gpus, str(data))
    membership = JobMembership()
    reconciler = Reconciler(db, backend, inventory, membership=membership)
    areas = StorageAreas(root / "storage")
    services = Services(db, backend, inventory, reconciler, allowed_mount_roots=[root], areas=areas)
    jobs = JobService(db, backend, inventory, report_url="http://127.0.0.1:9", membership=membership)
    return AppUnderTest(create_app(services, jobs, max_body_bytes=max_body_bytes), token)
