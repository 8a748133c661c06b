"""request rate buckets shared by every process on the store

Revision ID: 0019
Revises: 0018
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rate_buckets",
        sa.Column("account_id", sa.String(length=12), nullable=False),
        sa.Column("request_class", sa.String(length=16), nullable=False),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("counted_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("account_id", "request_class"),
    )


def downgrade() -> None:
    op.drop_table("rate_buckets")
