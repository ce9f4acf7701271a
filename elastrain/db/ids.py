"""Ids that are never handed out twice, on SQLite too: clusters, jobs and events.

SQLite gives a new row max(id) + 1: after the newest rows are deleted (a cluster and its jobs), their
ids would be handed out again. On SQLite a new row's id is therefore taken from ``id_high_water``
(migration 0010), which only goes up; PostgreSQL's sequences already never go back.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Mapper

from elastrain.db.models import Cluster, Event, Job

_TRACKED: dict[type[Any], str] = {Cluster: "clusters", Job: "jobs", Event: "events"}


def next_id(connection: Connection, table: str) -> int | None:
    """The next id of `table`: above every id it ever handed out (and every row it holds now).
    None where the table of marks does not exist (a database not migrated to 0010 yet)."""
    highest_now = f"COALESCE((SELECT MAX(id) FROM {table}), 0)"
    try:
        taken = connection.execute(
            text(
                f"UPDATE id_high_water SET last_id = MAX(last_id, {highest_now}) + 1 "
                "WHERE name = :name RETURNING last_id"
            ),
            {"name": table},
        ).scalar_one_or_none()
    except OperationalError:  # no such table: SQLite picks the id as it always did
        return None
    if taken is None:  # a database the migration has not seeded: start above what is there
        taken = connection.execute(text(f"SELECT COALESCE(MAX(id), 0) + 1 FROM {table}")).scalar_one()
        connection.execute(
            text("INSERT INTO id_high_water (name, last_id) VALUES (:name, :last)"),
            {"name": table, "last": taken},
        )
    return int(taken)


def _assign_id(_mapper: Mapper[Any], connection: Connection, target: Any) -> None:
    if target.id is None and connection.dialect.name == "sqlite":
        target.id = next_id(connection, _TRACKED[type(target)])


def never_reuse_ids() -> None:
    """Take SQLite ids from the high-water mark for every session of this process (idempotent)."""
    for model in _TRACKED:
        if not event.contains(model, "before_insert", _assign_id):
            event.listen(model, "before_insert", _assign_id)
