"""job metrics for any script: the scalars a job reports by name, and the job's TensorBoard directory

Revision ID: 0007
Revises: 0006
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add job_metrics.scalars (JSON text) and jobs.tensorboard_dir."""
    with op.batch_alter_table("job_metrics") as batch_op:
        batch_op.add_column(sa.Column("scalars", sa.Text(), nullable=True))
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(sa.Column("tensorboard_dir", sa.Text(), nullable=True))


def downgrade() -> None:
    """Drop the two columns."""
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_column("tensorboard_dir")
    with op.batch_alter_table("job_metrics") as batch_op:
        batch_op.drop_column("scalars")
