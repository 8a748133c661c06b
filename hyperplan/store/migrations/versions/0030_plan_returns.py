"""plans that can be returned: quotes, returns, the capacity they gave back, and its resales

Revision ID: 0030
Revises: 0029

No plan made before this revision was returned.
"""

import sqlalchemy as sa
from alembic import op

import hyperplan.store.types

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "return_quotes",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("plan_id", sa.Integer(), nullable=False),
        sa.Column("account_id", sa.String(length=12), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("windows", sa.Text(), nullable=False),
        sa.Column("refund", hyperplan.store.types.DecimalString(), nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("created_at", hyperplan.store.types.UTCDateTime(), nullable=False),
        sa.Column("valid_until", hyperplan.store.types.UTCDateTime(), nullable=False),
        sa.Column("used_at", hyperplan.store.types.UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(["plan_id"], ["training_plans.id"]),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_return_quotes_plan_id", "return_quotes", ["plan_id"])
    op.create_index("ix_return_quotes_account_id", "return_quotes", ["account_id"])
    op.create_table(
        "plan_returns",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("plan_id", sa.Integer(), nullable=False),
        sa.Column("account_id", sa.String(length=12), nullable=False),
        sa.Column("quote_id", sa.String(length=40), nullable=False),
        sa.Column("at", hyperplan.store.types.UTCDateTime(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("instance_hours", sa.Float(), nullable=False),
        sa.Column("refund", hyperplan.store.types.DecimalString(), nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("settled", sa.String(length=24), nullable=False),
        sa.ForeignKeyConstraint(["plan_id"], ["training_plans.id"]),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.id"]),
        sa.ForeignKeyConstraint(["quote_id"], ["return_quotes.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("quote_id"),
    )
    op.create_index("ix_plan_returns_plan_id", "plan_returns", ["plan_id"])
    op.create_index("ix_plan_returns_account_id", "plan_returns", ["account_id"])
    op.create_table(
        "returned_windows",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("return_id", sa.Integer(), nullable=False),
        sa.Column("plan_id", sa.Integer(), nullable=False),
        sa.Column("account_id", sa.String(length=12), nullable=False),
        sa.Column("instance_type", sa.String(length=64), nullable=False),
        sa.Column("availability_zone", sa.String(length=64), nullable=False),
        sa.Column("start", hyperplan.store.types.UTCDateTime(), nullable=False),
        sa.Column("end", hyperplan.store.types.UTCDateTime(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("price_per_instance_hour", hyperplan.store.types.DecimalString(), nullable=False),
        sa.Column("resale_share", hyperplan.store.types.DecimalString(), nullable=False),
        sa.ForeignKeyConstraint(["return_id"], ["plan_returns.id"]),
        sa.ForeignKeyConstraint(["plan_id"], ["training_plans.id"]),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_returned_windows_return_id", "returned_windows", ["return_id"])
    op.create_index(
        "ix_returned_windows_pool", "returned_windows", ["instance_type", "availability_zone", "end"]
    )
    op.create_table(
        "resales",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("window_id", sa.Integer(), nullable=False),
        sa.Column("buyer_plan_id", sa.Integer(), nullable=False),
        sa.Column("start", hyperplan.store.types.UTCDateTime(), nullable=False),
        sa.Column("end", hyperplan.store.types.UTCDateTime(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("credited", hyperplan.store.types.DecimalString(), nullable=False),
        sa.Column("at", hyperplan.store.types.UTCDateTime(), nullable=False),
        sa.Column("settled", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(["window_id"], ["returned_windows.id"]),
        sa.ForeignKeyConstraint(["buyer_plan_id"], ["training_plans.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_resales_window_id", "resales", ["window_id"])
    op.create_index("ix_resales_buyer_plan_id", "resales", ["buyer_plan_id"])


def downgrade() -> None:
    for table, indexes in (
        ("resales", ("ix_resales_buyer_plan_id", "ix_resales_window_id")),
        ("returned_windows", ("ix_returned_windows_pool", "ix_returned_windows_return_id")),
        ("plan_returns", ("ix_plan_returns_account_id", "ix_plan_returns_plan_id")),
        ("return_quotes", ("ix_return_quotes_account_id", "ix_return_quotes_plan_id")),
    ):
        for index in indexes:
            op.drop_index(index, table_name=table)
        op.drop_table(table)
