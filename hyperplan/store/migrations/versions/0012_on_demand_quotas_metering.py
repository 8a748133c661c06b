"""on-demand quotas and metering: an account's own on-demand quota, and one meter per on-demand holder

Revision ID: 0012
Revises: 0011

On-demand work already running when this revision is applied has no meter: it is not charged for
(metering starts with work that starts afterwards).
"""

import sqlalchemy as sa
from alembic import op

import hyperplan.store.types

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ADD COLUMN: a batch copy of `accounts` would trip over the tables that refer to it.
    op.add_column("accounts", sa.Column("max_on_demand_instances_per_type", sa.Integer(), nullable=True))
    op.create_table(
        "on_demand_meters",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("account_id", sa.String(length=12), nullable=False),
        sa.Column("holder", sa.String(length=64), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("instance_type", sa.String(length=64), nullable=False),
        sa.Column("availability_zone", sa.String(length=64), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("price_per_instance_hour", hyperplan.store.types.DecimalString(), nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("started_at", hyperplan.store.types.UTCDateTime(), nullable=False),
        sa.Column("ended_at", hyperplan.store.types.UTCDateTime(), nullable=True),
        sa.Column("hours_charged", sa.Integer(), nullable=False),
        sa.Column("charged", hyperplan.store.types.DecimalString(), nullable=False),
        sa.Column("closed", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("holder"),
    )
    op.create_index("ix_on_demand_meters_account_id", "on_demand_meters", ["account_id"], unique=False)
    op.create_index("ix_on_demand_meters_closed", "on_demand_meters", ["closed"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_on_demand_meters_closed", table_name="on_demand_meters")
    op.drop_index("ix_on_demand_meters_account_id", table_name="on_demand_meters")
    op.drop_table("on_demand_meters")
    with op.batch_alter_table("accounts") as batch:
        batch.drop_column("max_on_demand_instances_per_type")
