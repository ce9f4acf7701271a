"""token lifecycle and quotas: token name, expiry, revocation, last use; per-user quota overrides

Revision ID: 0006
Revises: 0005
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TOKEN_TIMES = ("expires_at", "revoked_at", "last_used_at")
_QUOTAS = ("quota_clusters", "quota_containers", "quota_gpus")


def upgrade() -> None:
    """Add api_tokens.name/expires_at/revoked_at/last_used_at (existing tokens: unnamed, never expire)
    and users.quota_clusters/quota_containers/quota_gpus (None: the server default)."""
    with op.batch_alter_table("api_tokens") as batch_op:
        batch_op.add_column(sa.Column("name", sa.String(length=63), nullable=False, server_default=""))
        for name in _TOKEN_TIMES:
            batch_op.add_column(sa.Column(name, sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("users") as batch_op:
        for name in _QUOTAS:
            batch_op.add_column(sa.Column(name, sa.Integer(), nullable=True))


def downgrade() -> None:
    """Drop the seven columns. Revoked and expiring tokens are deleted first: without their columns
    they would authenticate forever (tokens that never expire keep working)."""
    op.execute("DELETE FROM api_tokens WHERE revoked_at IS NOT NULL OR expires_at IS NOT NULL")
    # recreate="never": SQLite (>= 3.35) drops the columns in place; recreating `users` (drop + copy)
    # with foreign keys on would cascade-delete every token and refuse for users owning clusters
    with op.batch_alter_table("users", recreate="never") as batch_op:
        for name in reversed(_QUOTAS):
            batch_op.drop_column(name)
    with op.batch_alter_table("api_tokens", recreate="never") as batch_op:
        for name in reversed(("name", *_TOKEN_TIMES)):
            batch_op.drop_column(name)
