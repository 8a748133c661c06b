"""a change counter of its own for plans (issue 55)

The `calendar` counter moved with every change to a plan or to a segment, its status included. Each
move makes every process's live calendar read all that is held again at its next request (about 1 s
on a fleet of 2,000 nodes with 7,500 live plans), though a plan's status, or a segment's, holds no
capacity: the calendar reads only a segment's pool, times, count, `holds_capacity` and `released_at`.
From here a plan's changes move the new `plans` counter (what a search's check of the account reads:
the plans it holds), and the calendar counter moves only with what the calendar reads.

Revision ID: 0033
Revises: 0032
"""

import sqlalchemy as sa
from alembic import op

revision = "0033"
down_revision = "0032"
branch_labels = None
depends_on = None

COUNTERS = sa.table("change_counters", sa.column("name", sa.String), sa.column("value", sa.BigInteger))


def upgrade() -> None:
    op.execute(COUNTERS.insert().values(name="plans", value=0))


def downgrade() -> None:
    op.execute(COUNTERS.delete().where(COUNTERS.c.name == "plans"))
