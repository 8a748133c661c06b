"""an instance group and a training job on several plans: their further plans, and the plan each live
node and each job attempt runs on

Revision ID: 0026
Revises: 0025

Rows kept before this revision had one plan each: a live node of a plan group runs on its group's plan,
a job's attempt on the job's plan.
"""

import sqlalchemy as sa
from alembic import op

import hyperplan.store.types

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

LIVE_NODES_ON_THEIR_GROUPS_PLAN = """
UPDATE cluster_nodes SET plan_id = (
    SELECT instance_groups.plan_id FROM instance_groups WHERE instance_groups.id = cluster_nodes.group_id
)
WHERE on_plan = :on_plan AND status IN ('Pending', 'Running', 'Failure')
"""

ATTEMPTS_ON_THEIR_JOBS_PLAN = "UPDATE training_jobs SET attempt_plan_id = plan_id WHERE attempt > 0"


def upgrade() -> None:
    op.create_table(
        "instance_group_plans",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("group_id", sa.Integer(), nullable=False),
        sa.Column("plan_id", sa.Integer(), nullable=False),
        sa.Column("added_at", hyperplan.store.types.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["group_id"], ["instance_groups.id"]),
        sa.ForeignKeyConstraint(["plan_id"], ["training_plans.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("group_id", "plan_id"),
    )
    op.create_index("ix_instance_group_plans_group_id", "instance_group_plans", ["group_id"])
    op.create_index("ix_instance_group_plans_plan_id", "instance_group_plans", ["plan_id"])
    op.create_table(
        "training_job_plans",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("plan_id", sa.Integer(), nullable=False),
        sa.Column("added_at", hyperplan.store.types.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["training_jobs.id"]),
        sa.ForeignKeyConstraint(["plan_id"], ["training_plans.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("job_id", "plan_id"),
    )
    op.create_index("ix_training_job_plans_job_id", "training_job_plans", ["job_id"])
    op.create_index("ix_training_job_plans_plan_id", "training_job_plans", ["plan_id"])
    with op.batch_alter_table("cluster_nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("plan_id", sa.Integer(), nullable=True))
        batch_op.create_index("ix_cluster_nodes_plan_id", ["plan_id"])
        batch_op.create_foreign_key("fk_cluster_nodes_plan_id", "training_plans", ["plan_id"], ["id"])
    with op.batch_alter_table("training_jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("attempt_plan_id", sa.Integer(), nullable=True))
        batch_op.create_index("ix_training_jobs_attempt_plan_id", ["attempt_plan_id"])
        batch_op.create_foreign_key(
            "fk_training_jobs_attempt_plan_id", "training_plans", ["attempt_plan_id"], ["id"]
        )
    op.get_bind().execute(sa.text(LIVE_NODES_ON_THEIR_GROUPS_PLAN), {"on_plan": True})
    op.get_bind().execute(sa.text(ATTEMPTS_ON_THEIR_JOBS_PLAN))


def downgrade() -> None:
    with op.batch_alter_table("training_jobs", schema=None) as batch_op:
        batch_op.drop_constraint("fk_training_jobs_attempt_plan_id", type_="foreignkey")
        batch_op.drop_index("ix_training_jobs_attempt_plan_id")
        batch_op.drop_column("attempt_plan_id")
    with op.batch_alter_table("cluster_nodes", schema=None) as batch_op:
        batch_op.drop_constraint("fk_cluster_nodes_plan_id", type_="foreignkey")
        batch_op.drop_index("ix_cluster_nodes_plan_id")
        batch_op.drop_column("plan_id")
    op.drop_table("training_job_plans")
    op.drop_table("instance_group_plans")
