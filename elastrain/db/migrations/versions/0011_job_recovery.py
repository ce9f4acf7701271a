"""jobs that outlive their launcher: the launcher a job runs in, its coordinator's port, the secret its
tokens derive from, and its restart counts and budgets (platform failures apart from the user's exit codes)

Revision ID: 0011
Revises: 0010
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COUNTS = {
    "platform_restarts": "0",
    "max_platform_restarts": "3",
    "user_restarts": "0",
    "max_user_restarts": "0",
}


def upgrade() -> None:
    """Add the jobs' recovery columns."""
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.add_column(sa.Column("launcher_pid", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("coordinator_port", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("restart_secret", sa.String(64), nullable=True))
        for name, default in _COUNTS.items():
            batch_op.add_column(sa.Column(name, sa.Integer(), nullable=False, server_default=default))


def downgrade() -> None:
    """Drop them."""
    with op.batch_alter_table("jobs") as batch_op:
        for name in [*_COUNTS, "restart_secret", "coordinator_port", "launcher_pid"]:
            batch_op.drop_column(name)
