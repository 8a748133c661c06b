"""users and self-service keys: an account's users, each key held by one, keys Active or Inactive, and
the user who acted in a plan's history

Revision ID: 0013
Revises: 0012

Every existing account gets its first user, an owner named after the account, who holds every key the
account has (several may exceed the two a user may create: the limit is checked when a key is made).
"""

import sqlalchemy as sa
from alembic import op

import hyperplan.store.types

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("account_id", sa.String(length=12), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("is_owner", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("created_at", hyperplan.store.types.UTCDateTime(), nullable=False),
        sa.Column("deleted_at", hyperplan.store.types.UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_users_account_id", "users", ["account_id"], unique=False)
    op.create_index(
        "ux_users_live_name",
        "users",
        ["account_id", "name"],
        unique=True,
        sqlite_where=sa.text("deleted_at IS NULL"),
        postgresql_where=sa.text("deleted_at IS NULL"),
    )
    # Plain ADD COLUMNs (see 0011): a batch would copy access_keys and plan_events. SQLite adds a column
    # with its REFERENCES clause (its default is NULL), which Alembic's add_column does not write there.
    for table, column in (("access_keys", "user_id"), ("plan_events", "actor_user_id")):
        _add_user_reference(table, column)
    op.add_column(
        "access_keys", sa.Column("status", sa.String(length=8), server_default="Active", nullable=False)
    )
    op.create_index("ix_access_keys_user_id", "access_keys", ["user_id"], unique=False)
    # Each account's first user: an owner named after the account, holding the account's keys. A deleted
    # account's user is deleted with it.
    accounts = sa.table(
        "accounts",
        sa.column("id", sa.String),
        sa.column("name", sa.String),
        sa.column("created_at", sa.BigInteger),
        sa.column("deleted_at", sa.BigInteger),
    )
    users = sa.table(
        "users",
        sa.column("id", sa.Integer),
        sa.column("account_id", sa.String),
        sa.column("name", sa.String),
        sa.column("is_owner", sa.Boolean),
        sa.column("created_at", sa.BigInteger),
        sa.column("deleted_at", sa.BigInteger),
    )
    keys = sa.table("access_keys", sa.column("account_id", sa.String), sa.column("user_id", sa.Integer))
    op.execute(
        users.insert().from_select(
            ["account_id", "name", "is_owner", "created_at", "deleted_at"],
            sa.select(
                accounts.c.id, accounts.c.name, sa.true(), accounts.c.created_at, accounts.c.deleted_at
            ).order_by(accounts.c.created_at, accounts.c.id),
        )
    )
    op.execute(
        keys.update().values(
            user_id=sa.select(users.c.id).where(users.c.account_id == keys.c.account_id).scalar_subquery()
        )
    )


def _add_user_reference(table: str, column: str) -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute(f"ALTER TABLE {table} ADD COLUMN {column} INTEGER REFERENCES users (id)")
    else:
        op.add_column(table, sa.Column(column, sa.Integer(), sa.ForeignKey("users.id"), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("plan_events", schema=None) as batch_op:
        batch_op.drop_column("actor_user_id")
    with op.batch_alter_table("access_keys", schema=None) as batch_op:
        batch_op.drop_index("ix_access_keys_user_id")
        batch_op.drop_column("status")
        batch_op.drop_column("user_id")
    op.drop_index("ux_users_live_name", table_name="users")
    op.drop_index("ix_users_account_id", table_name="users")
    op.drop_table("users")
