"""cluster GPU type: the GPU model a cluster's containers need (null: any)

Revision ID: 0009
Revises: 0008
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add clusters.gpu_type (nullable: the clusters made before it take any GPU, as they did)."""
    with op.batch_alter_table("clusters") as batch_op:
        batch_op.add_column(sa.Column("gpu_type", sa.String(length=128), nullable=True))


def downgrade() -> None:
    """Drop the column."""
    with op.batch_alter_table("clusters") as batch_op:
        batch_op.drop_column("gpu_type")
