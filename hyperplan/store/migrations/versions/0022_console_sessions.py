"""console sessions recorded in the store, so that sign-out and idleness end them on every server

Revision ID: 0022
Revises: 0021
"""

import sqlalchemy as sa
from alembic import op

from hyperplan.store.types import UTCDateTime

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # No rows to move: a cookie signed before this revision has no row, so its session ends at the
    # upgrade and its user signs in again.
    op.create_table(
        "console_sessions",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("access_key_id", sa.String(length=128), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("last_seen_at", UTCDateTime(), nullable=False),
        sa.Column("idle_ends_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        op.f("ix_console_sessions_access_key_id"), "console_sessions", ["access_key_id"], unique=False
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_console_sessions_access_key_id"), table_name="console_sessions")
    op.drop_table("console_sessions")
