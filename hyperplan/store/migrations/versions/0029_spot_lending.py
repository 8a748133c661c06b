"""managed spot training on idle reserved capacity: plans' lending policies, spot runs, and a job's spot
fields

Revision ID: 0029
Revises: 0028

No plan made before this revision lends (no policy row); no job is a spot job.
"""

import sqlalchemy as sa
from alembic import op

import hyperplan.store.types

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "lending_policies",
        sa.Column("plan_id", sa.Integer(), nullable=False),
        sa.Column("notice_seconds", sa.Integer(), nullable=False),
        sa.Column("min_run_seconds", sa.Integer(), nullable=False),
        sa.Column("stop_margin_seconds", sa.Integer(), nullable=False),
        sa.Column("updated_at", hyperplan.store.types.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["plan_id"], ["training_plans.id"]),
        sa.PrimaryKeyConstraint("plan_id"),
    )
    op.create_table(
        "spot_runs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("account_id", sa.String(length=12), nullable=False),
        sa.Column("plan_id", sa.Integer(), nullable=True),
        sa.Column("reserved_capacity_id", sa.Integer(), nullable=True),
        sa.Column("owner_account_id", sa.String(length=12), nullable=True),
        sa.Column("instance_type", sa.String(length=64), nullable=False),
        sa.Column("availability_zone", sa.String(length=64), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("price_per_instance_hour", hyperplan.store.types.DecimalString(), nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("lender_share", hyperplan.store.types.DecimalString(), nullable=False),
        sa.Column("notice_seconds", sa.Integer(), nullable=False),
        sa.Column("started_at", hyperplan.store.types.UTCDateTime(), nullable=False),
        sa.Column("ended_at", hyperplan.store.types.UTCDateTime(), nullable=True),
        sa.Column("reclaim_reason", sa.String(length=32), nullable=False),
        sa.Column("reclaim_requested_at", hyperplan.store.types.UTCDateTime(), nullable=True),
        sa.Column("reclaim_deadline", hyperplan.store.types.UTCDateTime(), nullable=True),
        sa.Column("charged", hyperplan.store.types.DecimalString(), nullable=False),
        sa.Column("credited", hyperplan.store.types.DecimalString(), nullable=False),
        sa.Column("settled", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["training_jobs.id"]),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.id"]),
        sa.ForeignKeyConstraint(["plan_id"], ["training_plans.id"]),
        sa.ForeignKeyConstraint(["reserved_capacity_id"], ["reserved_capacities.id"]),
        sa.ForeignKeyConstraint(["owner_account_id"], ["accounts.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("job_id", "attempt"),
    )
    op.create_index("ix_spot_runs_job_id", "spot_runs", ["job_id"])
    op.create_index("ix_spot_runs_account_id", "spot_runs", ["account_id"])
    op.create_index("ix_spot_runs_owner_account_id", "spot_runs", ["owner_account_id"])
    op.create_index("ix_spot_runs_plan_open", "spot_runs", ["plan_id", "ended_at"])
    with op.batch_alter_table("training_jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("spot", sa.Boolean(), server_default=sa.false(), nullable=False))
        batch_op.add_column(sa.Column("max_wait_seconds", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("lent_plan_id", sa.Integer(), nullable=True))
        batch_op.create_foreign_key(
            "fk_training_jobs_lent_plan_id", "training_plans", ["lent_plan_id"], ["id"]
        )


def downgrade() -> None:
    with op.batch_alter_table("training_jobs", schema=None) as batch_op:
        batch_op.drop_constraint("fk_training_jobs_lent_plan_id", type_="foreignkey")
        batch_op.drop_column("lent_plan_id")
        batch_op.drop_column("max_wait_seconds")
        batch_op.drop_column("spot")
    op.drop_index("ix_spot_runs_plan_open", table_name="spot_runs")
    op.drop_index("ix_spot_runs_owner_account_id", table_name="spot_runs")
    op.drop_index("ix_spot_runs_account_id", table_name="spot_runs")
    op.drop_index("ix_spot_runs_job_id", table_name="spot_runs")
    op.drop_table("spot_runs")
    op.drop_table("lending_policies")
