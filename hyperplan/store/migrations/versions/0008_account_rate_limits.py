"""account rate limits: an administrator's overrides of the fleet's request rate limits

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ADD COLUMN: a batch copy of `accounts` would trip over the tables that refer to it.
    op.add_column("accounts", sa.Column("rate_limits", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("accounts") as batch:
        batch.drop_column("rate_limits")
