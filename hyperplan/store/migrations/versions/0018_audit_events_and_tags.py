"""audit events, resource tags, and the usage of deleted clusters' nodes

Revision ID: 0018
Revises: 0017
"""

import sqlalchemy as sa
from alembic import op

import hyperplan.store.types

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", hyperplan.store.types.UTCDateTime(), nullable=False),
        sa.Column("wall_at", hyperplan.store.types.UTCDateTime(), nullable=False),
        sa.Column("action", sa.String(length=48), nullable=False),
        sa.Column("actor_account_id", sa.String(length=12), nullable=True),
        sa.Column("actor_account_name", sa.String(length=64), nullable=False),
        sa.Column("actor_user_name", sa.String(length=64), nullable=False),
        sa.Column("access_key_id", sa.String(length=128), nullable=False),
        sa.Column("remote_address", sa.String(length=64), nullable=False),
        sa.Column("account_id", sa.String(length=12), nullable=True),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_audit_events_at", "audit_events", ["at", "id"], unique=False)
    op.create_index("ix_audit_events_actor_account_id", "audit_events", ["actor_account_id"], unique=False)
    op.create_index("ix_audit_events_account_id", "audit_events", ["account_id"], unique=False)
    op.create_table(
        "resource_tags",
        sa.Column("resource_arn", sa.String(length=256), nullable=False),
        sa.Column("key", sa.String(length=128), nullable=False),
        sa.Column("value", sa.String(length=256), nullable=False),
        sa.Column("account_id", sa.String(length=12), nullable=False),
        sa.PrimaryKeyConstraint("resource_arn", "key"),
    )
    op.create_index("ix_resource_tags_account_id", "resource_tags", ["account_id"], unique=False)
    op.create_table(
        "ended_node_usage",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("account_id", sa.String(length=12), nullable=False),
        sa.Column("cluster_id", sa.String(length=32), nullable=False),
        sa.Column("instance_type", sa.String(length=64), nullable=False),
        sa.Column("availability_zone", sa.String(length=64), nullable=False),
        sa.Column("launched_at", hyperplan.store.types.UTCDateTime(), nullable=False),
        sa.Column("ended_at", hyperplan.store.types.UTCDateTime(), nullable=False),
        sa.Column("backend_id", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_ended_node_usage_account_id", "ended_node_usage", ["account_id"], unique=False)
    op.create_index("ix_ended_node_usage_ended_at", "ended_node_usage", ["ended_at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_ended_node_usage_ended_at", table_name="ended_node_usage")
    op.drop_index("ix_ended_node_usage_account_id", table_name="ended_node_usage")
    op.drop_table("ended_node_usage")
    op.drop_index("ix_resource_tags_account_id", table_name="resource_tags")
    op.drop_table("resource_tags")
    op.drop_index("ix_audit_events_account_id", table_name="audit_events")
    op.drop_index("ix_audit_events_actor_account_id", table_name="audit_events")
    op.drop_index("ix_audit_events_at", table_name="audit_events")
    op.drop_table("audit_events")
