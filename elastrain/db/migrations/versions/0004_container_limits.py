"""container limits: memory and CPUs per container

Revision ID: 0004
Revises: 0003
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add clusters.memory_bytes and clusters.cpus (0: no limit)."""
    with op.batch_alter_table("clusters") as batch_op:
        batch_op.add_column(sa.Column("memory_bytes", sa.BigInteger(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("cpus", sa.Float(), nullable=False, server_default="0"))


def downgrade() -> None:
    """Drop the two columns."""
    with op.batch_alter_table("clusters") as batch_op:
        for name in ("cpus", "memory_bytes"):
            batch_op.drop_column(name)
