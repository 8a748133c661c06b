"""indexes that serve a purchase's reads inside the writers' turn

The pools' holdings (store/purchase_reads.py read_holdings) read every column they need from the
pool-and-time index of reserved_capacities, not each row from the table; an account's active plans are
counted from an (account_id, status) index, over the plans that count only, not every plan it ever had
(that index also serves what the account_id one did, which it replaces).

Revision ID: 0020
Revises: 0019
"""

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

_POOL_TIME = ["instance_type", "availability_zone", "start", "end"]
_POOL_TIME_COVERING = [*_POOL_TIME, "holds_capacity", "released_at", "count"]


def upgrade() -> None:
    op.drop_index("ix_rc_pool_time", table_name="reserved_capacities")
    op.create_index("ix_rc_pool_time", "reserved_capacities", _POOL_TIME_COVERING)
    op.create_index("ix_plan_account_status", "training_plans", ["account_id", "status"])
    op.drop_index("ix_training_plans_account_id", table_name="training_plans")


def downgrade() -> None:
    op.create_index("ix_training_plans_account_id", "training_plans", ["account_id"])
    op.drop_index("ix_plan_account_status", table_name="training_plans")
    op.drop_index("ix_rc_pool_time", table_name="reserved_capacities")
    op.create_index("ix_rc_pool_time", "reserved_capacities", _POOL_TIME)
