"""accounts' OS users: the user an account's work runs as, whether the server made it, and deletion

Revision ID: 0011
Revises: 0010

Existing accounts get no user here (a migration runs no useradd): the next start in isolation mode
`users` gives each one its `hp-<id>` user (hyperplan/services/accounts/os_users.py).
"""

import sqlalchemy as sa
from alembic import op

import hyperplan.store.types

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMNs: a batch would copy the table, and SQLite refuses to drop `accounts` while other
    # tables' foreign keys name it (the Boolean takes no CHECK constraint, which ADD COLUMN cannot add).
    op.add_column("accounts", sa.Column("os_user", sa.String(length=32), nullable=True))
    op.add_column(
        "accounts",
        sa.Column(
            "os_user_made", sa.Boolean(create_constraint=False), nullable=False, server_default=sa.false()
        ),
    )
    op.add_column("accounts", sa.Column("deleted_at", hyperplan.store.types.UTCDateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("accounts", schema=None) as batch_op:
        batch_op.drop_column("deleted_at")
        batch_op.drop_column("os_user_made")
        batch_op.drop_column("os_user")
