"""elastic scheduling: container bounds, priority, admission and the reason for a cluster's size

Revision ID: 0003
Revises: 0002
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add clusters.min_containers, max_containers, priority, admitted and size_reason."""
    with op.batch_alter_table("clusters") as batch_op:
        batch_op.add_column(sa.Column("min_containers", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("max_containers", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("priority", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("admitted", sa.Boolean(), nullable=False, server_default=sa.true()))
        batch_op.add_column(sa.Column("size_reason", sa.Text(), nullable=False, server_default=""))


def downgrade() -> None:
    """Drop the five columns."""
    with op.batch_alter_table("clusters") as batch_op:
        for name in ("size_reason", "admitted", "priority", "max_containers", "min_containers"):
            batch_op.drop_column(name)
