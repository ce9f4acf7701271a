"""event isolation: events keyed by the cluster's uid (a new cluster reusing a name sees none of the old)

Revision ID: 0005
Revises: 0004
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add events.cluster_uid; existing events get the uid of the cluster of that name and owner."""
    with op.batch_alter_table("events") as batch_op:
        batch_op.add_column(sa.Column("cluster_uid", sa.String(length=32), nullable=False, server_default=""))
        batch_op.create_index("ix_events_cluster_uid", ["cluster_uid"])
    op.execute(
        "UPDATE events SET cluster_uid = COALESCE((SELECT clusters.uid FROM clusters"
        " WHERE clusters.name = events.cluster AND clusters.owner_id = events.owner_id), '')"
        " WHERE events.cluster != ''"
    )


def downgrade() -> None:
    """Drop the column."""
    with op.batch_alter_table("events") as batch_op:
        batch_op.drop_index("ix_events_cluster_uid")
        batch_op.drop_column("cluster_uid")
