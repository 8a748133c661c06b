"""usage: whether a deleted cluster's node ran on a plan's capacity or on demand

Revision ID: 0025
Revises: 0024

The usage report counts a plan's use from its capacity claims and on-demand use from the nodes of
on-demand groups (services/plans/usage.py); a deleted cluster's nodes survive only as ended_node_usage
rows, which now say which they were. Rows kept before this revision did not record it: a node launched
inside a segment of one of its account's plans in its own pool is taken to have been that plan's (plan
groups are provisioned at a segment's start, in its pool), any other as on demand.
"""

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

EARLIER_ROWS_ON_PLANS = """
UPDATE ended_node_usage SET on_plan = :on_plan
WHERE EXISTS (
    SELECT 1 FROM reserved_capacities AS segment
    JOIN training_plans AS plan ON plan.id = segment.plan_id
    WHERE plan.account_id = ended_node_usage.account_id
      AND segment.instance_type = ended_node_usage.instance_type
      AND segment.availability_zone = ended_node_usage.availability_zone
      AND segment.holds_capacity = :holds
      AND segment.start <= ended_node_usage.launched_at
      AND segment."end" > ended_node_usage.launched_at
)
"""


def upgrade() -> None:
    with op.batch_alter_table("ended_node_usage", schema=None) as batch_op:
        batch_op.add_column(sa.Column("on_plan", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.get_bind().execute(sa.text(EARLIER_ROWS_ON_PLANS), {"on_plan": True, "holds": True})


def downgrade() -> None:
    with op.batch_alter_table("ended_node_usage", schema=None) as batch_op:
        batch_op.drop_column("on_plan")
