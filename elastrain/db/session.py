"""Database engine, sessions and migrations (Alembic, applied programmatically at server start)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.orm import Session, sessionmaker

from elastrain.errors import ConfigError

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def normalize_url(url: str) -> str:
    """Map ``postgresql://`` / ``postgres://`` to the psycopg v3 driver; other URLs pass through."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    if not url.startswith(("sqlite", "postgresql+")):
        raise ConfigError(f"database URL {url!r} is not supported; use sqlite:///PATH or postgresql://...")
    return url


SQLITE_POOL_SIZE = 20


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def sqlite_path(url: str) -> Path | None:
    """The file of an SQLite database URL (None: another database, or an in-memory one)."""
    parsed = make_url(url)
    name = parsed.database or ""
    if not parsed.drivername.startswith("sqlite") or name in ("", ":memory:") or name.startswith("file:"):
        return None
    return Path(name).expanduser().absolute()


def _private_sqlite_file(path: Path) -> None:
    """Create the database file 0600 before SQLite does (its -wal and -shm files copy the database
    file's mode), and make existing ones 0600: no other user of the machine reads tokens or events."""
    if not path.parent.is_dir():
        return  # SQLite itself says that the directory is missing
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
        for suffix in ("", "-wal", "-shm", "-journal"):
            found = path.with_name(path.name + suffix)
            if found.exists() and not found.is_symlink():
                os.chmod(found, 0o600)
    except OSError:  # e.g. a read-only copy of someone else's database: SQLite reports what matters
        pass


class Database:
    """An engine plus a session factory; `migrate()` brings the schema to the newest revision."""

    def __init__(self, url: str) -> None:
        self.url = normalize_url(url)
        kwargs: dict[str, Any] = {"future": True}
        if self.url.startswith("sqlite"):
            path = sqlite_path(self.url)
            if path is not None:
                _private_sqlite_file(path)
                # the API's threads (40) each hold a connection while they work: with the default 5
                # (+10 overflow) a burst opens and closes connections, and each opening runs the
                # pragmas below again. SQLite connections are cheap to keep.
                kwargs.update(pool_size=SQLITE_POOL_SIZE, max_overflow=SQLITE_POOL_SIZE)
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 10}
        else:
            kwargs["pool_pre_ping"] = True
        self.engine: Engine = create_engine(self.url, **kwargs)
        if self.url.startswith("sqlite"):
            event.listen(self.engine, "connect", _sqlite_pragmas)
            from elastrain.db.ids import never_reuse_ids

            never_reuse_ids()
        self._factory = sessionmaker(self.engine, expire_on_commit=False)

    def migrate(self) -> None:
        """Apply every Alembic migration not yet applied (idempotent)."""
        from alembic import command
        from alembic.config import Config

        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS_DIR))
        config.set_main_option("sqlalchemy.url", self.url.replace("%", "%%"))
        with self.engine.begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, "head")

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session in a transaction: committed on success, rolled back on error."""
        session = self._factory()
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    def dispose(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()
