"""status events

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

import hyperplan.store.types

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "status_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("entity_kind", sa.String(length=32), nullable=False),
        sa.Column("entity_id", sa.Integer(), nullable=False),
        sa.Column("from_status", sa.String(length=24), nullable=False),
        sa.Column("to_status", sa.String(length=24), nullable=False),
        sa.Column("at", hyperplan.store.types.UTCDateTime(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("status_events", schema=None) as batch_op:
        batch_op.create_index("ix_status_event_entity", ["entity_kind", "entity_id", "id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("status_events", schema=None) as batch_op:
        batch_op.drop_index("ix_status_event_entity")

    op.drop_table("status_events")
