"""elastic by default: a cluster's requested size, idle release, and the scheduler's attained service

Revision ID: 0008
Revises: 0007
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = (
    ("requested_containers", sa.Integer(), None),
    ("idle_release_after", sa.Integer(), None),
    ("idle_released", sa.Boolean(), sa.false()),
    ("active_at", sa.DateTime(timezone=True), None),
    ("attained_gpu_s", sa.Float(), "0"),
    ("service_since", sa.DateTime(timezone=True), None),
)


def upgrade() -> None:
    """Add the six columns to clusters (existing rows: nothing requested, never released, no service)."""
    with op.batch_alter_table("clusters") as batch_op:
        for name, kind, default in COLUMNS:
            batch_op.add_column(sa.Column(name, kind, nullable=default is None, server_default=default))


def downgrade() -> None:
    """Drop them."""
    with op.batch_alter_table("clusters") as batch_op:
        for name, _, _ in reversed(COLUMNS):
            batch_op.drop_column(name)
