"""A real `create_app` in process (SQLite, the process backend, nothing started) for TestClient tests."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI

from elastrain.server.access_log import LOGGER_NAME


@dataclass
class AppUnderTest:
    app: FastAPI
    token: str  # the admin's


def make_app(root: Path, *, max_body_bytes: int | None = None) -> AppUnderTest:
    """`create_app` wired to real services on `root` (no reconciler thread, no API relay)."""
    from elastrain.backends.local import LocalBackend
    from elastrain.db.session import Database
    from elastrain.server.app import create_app
    from elastrain.server.inventory import Inventory
    from elastrain.server.jobs import JobService
    from elastrain.server.main import bootstrap_admin
    from elastrain.server.membership import JobMembership
    from elastrain.server.reconciler import Reconciler
    from elastrain.server.services import Services

    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    db = Database(f"sqlite:///{data / 'elastrain.db'}")
    db.migrate()
    token = bootstrap_admin(db, data)
    assert token
    backend = LocalBackend(data)
    inventory = Inventory.create(0, str(data))
    membership = JobMembership()
    reconciler = Reconciler(db, backend, inventory, membership=membership)
    services = Services(db, backend, inventory, reconciler, allowed_mount_roots=[root])
    jobs = JobService(db, backend, inventory, report_url="http://127.0.0.1:9", membership=membership)
    return AppUnderTest(create_app(services, jobs, max_body_bytes=max_body_bytes), token)


class Lines(logging.Handler):
    """Collects formatted records."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextmanager
def access_lines() -> Iterator[list[str]]:
    """The access-log lines logged while the block runs."""
    logger = logging.getLogger(LOGGER_NAME)
    handler, level = Lines(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
