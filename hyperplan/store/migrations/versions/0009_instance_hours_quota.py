"""instance-hours quota: an account's own quota of reserved instance-hours in any 30 days

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ADD COLUMN: a batch copy of `accounts` would trip over the tables that refer to it.
    op.add_column(
        "accounts", sa.Column("max_reserved_instance_hours_per_30_days", sa.Integer(), nullable=True)
    )


def downgrade() -> None:
    with op.batch_alter_table("accounts") as batch:
        batch.drop_column("max_reserved_instance_hours_per_30_days")
