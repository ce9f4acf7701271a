"""Every Alembic migration, up and down, on SQLite (batch mode) and PostgreSQL, with data in the tables.

Revision 0006 (token lifecycle and quotas) is checked on rows written before it: an old token keeps
working (unnamed, never expiring), and a downgrade drops the tokens that only the new columns held back.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import inspect, text

from elastrain.db.models import Cluster, Framework
from elastrain.db.repository import all_clusters, hash_token, user_by_token
from elastrain.db.session import MIGRATIONS_DIR, Database
from elastrain.testing.postgres import Postgres


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    else:
        server: Postgres = request.getfixturevalue("postgres")
        url = server.new_database()
    db = Database(url)
    yield db
    db.dispose()


def _alembic(db: Database, action: str, revision: str) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", db.url.replace("%", "%%"))
    with db.engine.begin() as connection:
        config.attributes["connection"] = connection
        getattr(command, action)(config, revision)


def _columns(db: Database, table: str) -> set[str]:
    return {c["name"] for c in inspect(db.engine).get_columns(table)}


def _add_token(db: Database, user_id: int, token: str, extra: str = "", values: str = "") -> None:
    with db.engine.begin() as conn:
        conn.execute(
            text(
                f"INSERT INTO api_tokens (user_id, token_hash, created_at{extra})"
                f" VALUES (:user, :hash, :now{values})"
            ),
            {"user": user_id, "hash": hash_token(token), "now": datetime.now(timezone.utc)},
        )


def test_every_migration_goes_up_and_down(database: Database) -> None:
    database.migrate()
    database.migrate()  # idempotent
    _alembic(database, "downgrade", "base")
    assert "users" not in inspect(database.engine).get_table_names()
    database.migrate()
    assert {"quota_clusters", "quota_containers", "quota_gpus"} <= _columns(database, "users")


def test_0006_keeps_old_tokens_working_and_its_downgrade_drops_held_back_ones(database: Database) -> None:
    _alembic(database, "upgrade", "0005")
    with database.engine.begin() as conn:
        conn.execute(
            text("INSERT INTO users (name, is_admin, created_at) VALUES ('old', false, :now)"),
            {"now": datetime.now(timezone.utc)},
        )
        user_id = int(conn.execute(text("SELECT id FROM users WHERE name = 'old'")).scalar_one())
    _add_token(database, user_id, "et_before")
    database.migrate()
    assert {"name", "expires_at", "revoked_at", "last_used_at"} <= _columns(database, "api_tokens")
    with database.session() as session:
        user = user_by_token(session, "et_before")
        assert user is not None and user.name == "old" and user.quota_clusters is None
        user.quota_containers = 5
        session.add(
            Cluster(name="c", uid="u-c", owner=user, framework=Framework.pytorch, desired_containers=2)
        )
    past = datetime.now(timezone.utc) - timedelta(days=1)
    later = datetime.now(timezone.utc) + timedelta(days=1)
    _add_token(database, user_id, "et_revoked", ", revoked_at", ", :now")
    with database.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO api_tokens (user_id, token_hash, created_at, name, expires_at)"
                " VALUES (:user, :hash, :now, 'soon', :at)"
            ),
            [
                {"user": user_id, "hash": hash_token("et_expired"), "now": past, "at": past},
                {"user": user_id, "hash": hash_token("et_expiring"), "now": past, "at": later},
            ],
        )
    _alembic(database, "downgrade", "0005")
    assert "revoked_at" not in _columns(database, "api_tokens")
    assert "quota_gpus" not in _columns(database, "users")
    with database.engine.begin() as conn:
        left = set(conn.execute(text("SELECT token_hash FROM api_tokens")).scalars())
    assert left == {hash_token("et_before")}  # without the columns the others would work forever
    database.migrate()
    with database.session() as session:
        assert user_by_token(session, "et_before") is not None
        assert [c.name for c in all_clusters(session)] == ["c"]  # the owner's rows were not touched
