"""indexes that keep a request's reads bounded by the live set, not by history (issue 55)

Revision ID: 0031
Revises: 0030

A year of bookings leaves most rows of these tables in the past; each index lets a hot read skip them:

- ix_plan_account_live (training_plans: account, status; partial: plans not Expired or Failed): the
  quota's count of an account's plans (a purchase's refusal check, a search's allowance) reads its live
  plans only, not every plan it ever had. Its predicate is the one the count writes (schema.LIVE_PLAN).
- ix_rc_type_end (reserved_capacities: type, then end; covering): what a pool holds over a window, and
  what an account holds of a type, is read as the range `end > window start` (a segment is held no
  later than its end), which holds the window's and the future's segments of the type; ix_rc_pool_time's
  range `start < window end` held the type's whole past. The account's are kept by a look at each
  segment's plan, instead of visiting every plan of the account and each one's segments.
- ix_rc_end (reserved_capacities: end, then the rest; covering): the same for every type (an account's
  holdings under the instance-hours quota, what is held from an instant on, the open segments).
- ix_ext_holding (plan_extensions: pool, end; partial: extensions that hold capacity themselves, i.e.
  unpaid ones): the purchase's holdings read these few rows, not every extension ever bought.
- ix_rc_length (reserved_capacities: "end" - start): the longest segment, read from its last entry,
  bounds the ends a window's holdings can have (end < window end + longest: a segment that ends later
  starts after the window), so that the ranges by end read what overlaps the window, not every segment
  booked after it (the weeks ahead of a busy type).

Timed on a store of 50,000 plans and 200,000 segments over 12 months in 1,000 accounts: 0.4 s on SQLite,
0.5 s on PostgreSQL (the indexes are built from the tables in one pass each).

Nothing else changes: no row is written, and the answers of the reads are the same.
"""

import sqlalchemy as sa
from alembic import op

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None

# As schema.py writes them (LIVE_PLAN, HOLDING_EXTENSION_*, SEGMENT_LENGTH): a migration keeps its own
# copy, so that a later change of the schema's constants does not change what this revision did.
_LIVE_PLAN = "status NOT IN ('Expired', 'Failed')"
_HOLDING_SQLITE = "holds_capacity IS 1"
_HOLDING_POSTGRESQL = "holds_capacity IS true"
_SEGMENT_LENGTH = '("end" - start)'


def upgrade() -> None:
    op.create_index(
        "ix_plan_account_live",
        "training_plans",
        ["account_id", "status"],
        sqlite_where=sa.text(_LIVE_PLAN),
        postgresql_where=sa.text(_LIVE_PLAN),
    )
    op.create_index(
        "ix_rc_type_end",
        "reserved_capacities",
        [
            "instance_type",
            "end",
            "availability_zone",
            "start",
            "holds_capacity",
            "released_at",
            "count",
            "plan_id",
        ],
    )
    op.create_index(
        "ix_rc_end",
        "reserved_capacities",
        [
            "end",
            "instance_type",
            "availability_zone",
            "start",
            "holds_capacity",
            "released_at",
            "count",
            "plan_id",
        ],
    )
    op.create_index("ix_rc_length", "reserved_capacities", [sa.text(_SEGMENT_LENGTH)])
    op.create_index(
        "ix_ext_holding",
        "plan_extensions",
        ["instance_type", "availability_zone", "end"],
        sqlite_where=sa.text(_HOLDING_SQLITE),
        postgresql_where=sa.text(_HOLDING_POSTGRESQL),
    )


def downgrade() -> None:
    op.drop_index("ix_ext_holding", table_name="plan_extensions")
    op.drop_index("ix_rc_length", table_name="reserved_capacities")
    op.drop_index("ix_rc_end", table_name="reserved_capacities")
    op.drop_index("ix_rc_type_end", table_name="reserved_capacities")
    op.drop_index("ix_plan_account_live", table_name="training_plans")
