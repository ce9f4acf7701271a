"""job reporting: a per-job report token (hashed) and the job's log path

Revision ID: 0002
Revises: 0001
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add jobs.report_token_hash and jobs.log_path."""
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(sa.Column("report_token_hash", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("log_path", sa.Text(), nullable=False, server_default=""))


def downgrade() -> None:
    """Drop the two columns."""
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_column("log_path")
        batch_op.drop_column("report_token_hash")
