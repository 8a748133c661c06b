"""the OS ids handed to accounts, never handed out again

Revision ID: 0021
Revises: 0020
"""

import sqlalchemy as sa
from alembic import op

from hyperplan.store.types import UTCDateTime

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "os_id_blocks",
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("first", sa.BigInteger(), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.Column("account_id", sa.String(length=12), nullable=False),
        sa.Column("allocated_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.id"]),
        sa.PrimaryKeyConstraint("kind", "first"),
    )
    op.create_index(op.f("ix_os_id_blocks_account_id"), "os_id_blocks", ["account_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_os_id_blocks_account_id"), table_name="os_id_blocks")
    op.drop_table("os_id_blocks")
