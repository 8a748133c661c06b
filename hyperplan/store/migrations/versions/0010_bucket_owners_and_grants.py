"""bucket owners and grants

Revision ID: 0010
Revises: 0009

Buckets created before this revision have no recorded owner, so they are the administrators' until an
administrator grants them (`hyperplan buckets grant`).
"""

import sqlalchemy as sa
from alembic import op

import hyperplan.store.types

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "bucket_owners",
        sa.Column("bucket", sa.String(length=63), nullable=False),
        sa.Column("account_id", sa.String(length=12), nullable=False),
        sa.Column("created_at", hyperplan.store.types.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.id"]),
        sa.PrimaryKeyConstraint("bucket"),
    )
    with op.batch_alter_table("bucket_owners", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_bucket_owners_account_id"), ["account_id"], unique=False)
    op.create_table(
        "bucket_grants",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("bucket", sa.String(length=63), nullable=False),
        sa.Column("grantee", sa.String(length=12), nullable=False),
        sa.Column("access", sa.String(length=8), nullable=False),
        sa.Column("created_at", hyperplan.store.types.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("bucket", "grantee"),
    )
    with op.batch_alter_table("bucket_grants", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_bucket_grants_grantee"), ["grantee"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("bucket_grants", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_bucket_grants_grantee"))
    op.drop_table("bucket_grants")
    with op.batch_alter_table("bucket_owners", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_bucket_owners_account_id"))
    op.drop_table("bucket_owners")
