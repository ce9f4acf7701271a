"""ids never handed out twice: the high-water mark of the clusters', jobs' and events' ids

SQLite gives a new row max(id) + 1, so after a cluster (and its jobs) is deleted the next job could be
job 1 again, and an old link, log or metric name a new job. `elastrain.db.ids` takes ids from
``id_high_water`` on SQLite instead; PostgreSQL's sequences never go back and leave the table unused.

Revision ID: 0010
Revises: 0009
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("clusters", "jobs", "events")


def upgrade() -> None:
    """Create id_high_water, seeded with each table's largest id (jobs: also those its events name)."""
    op.create_table(
        "id_high_water",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("last_id", sa.Integer(), nullable=False),
    )
    bind = op.get_bind()
    for table in TABLES:
        last = bind.execute(sa.text(f"SELECT COALESCE(MAX(id), 0) FROM {table}")).scalar_one()
        if table == "jobs" and bind.dialect.name == "sqlite":
            # a deleted cluster's jobs are gone, but its events still name them
            named = bind.execute(
                sa.text(
                    "SELECT COALESCE(MAX(CAST(json_extract(detail, '$.job') AS INTEGER)), 0) FROM events "
                    "WHERE json_valid(detail)"
                )
            ).scalar_one()
            last = max(int(last), int(named or 0))
        bind.execute(
            sa.text("INSERT INTO id_high_water (name, last_id) VALUES (:name, :last)"),
            {"name": table, "last": int(last)},
        )


def downgrade() -> None:
    """Drop id_high_water (SQLite goes back to max(id) + 1)."""
    op.drop_table("id_high_water")
