"""reclaim warnings and automatic extensions: an account's warning lead times, a plan's extension policy
and its attempts

Revision ID: 0028
Revises: 0027

An account made before this revision has no lead times of its own (NULL: the default, 24 and 1 hours);
no plan has a policy. Plans bought before it get their warnings from their next extension on (their
segments' timed events were written at purchase).
"""

import sqlalchemy as sa
from alembic import op

import hyperplan.store.types

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("accounts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("reclaim_warning_hours", sa.Text(), nullable=True))
    op.create_table(
        "extension_policies",
        sa.Column("plan_id", sa.Integer(), nullable=False),
        sa.Column("max_days", sa.Integer(), nullable=False),
        sa.Column("max_price", hyperplan.store.types.DecimalString(), nullable=True),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("days_bought", sa.Integer(), nullable=False),
        sa.Column("updated_at", hyperplan.store.types.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["plan_id"], ["training_plans.id"]),
        sa.PrimaryKeyConstraint("plan_id"),
    )
    op.create_table(
        "extension_attempts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("plan_id", sa.Integer(), nullable=False),
        sa.Column("at", hyperplan.store.types.UTCDateTime(), nullable=False),
        sa.Column("segment_end", hyperplan.store.types.UTCDateTime(), nullable=False),
        sa.Column("lead_hours", sa.Integer(), nullable=False),
        sa.Column("bought", sa.Boolean(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["plan_id"], ["training_plans.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("plan_id", "segment_end", "lead_hours"),
    )
    op.create_index("ix_extension_attempts_plan_id", "extension_attempts", ["plan_id"])


def downgrade() -> None:
    op.drop_index("ix_extension_attempts_plan_id", table_name="extension_attempts")
    op.drop_table("extension_attempts")
    op.drop_table("extension_policies")
    with op.batch_alter_table("accounts", schema=None) as batch_op:
        batch_op.drop_column("reclaim_warning_hours")
