"""Alembic environment: runs on the connection the caller put in ``config.attributes["connection"]``."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from elastrain.db.models import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_online() -> None:
    """Migrate on the given connection, or on a fresh engine for ``sqlalchemy.url``."""
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(config.get_main_option("sqlalchemy.url") or "sqlite://")
    with engine.connect() as conn:
        context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()


run_migrations_online()
