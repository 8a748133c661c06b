"""change counters and leases: what lets several processes and servers share one store

Revision ID: 0017
Revises: 0013

`change_counters`: one row per kind of shared state (the capacity calendar, access keys, settings such as
the service clock, timed events, webhook deliveries, the job and node wakes, clock moves); a transaction
that changes such state adds one to its row, and every process compares the row with what it last saw
(store/changes.py). `leases`: named leases held by one process until they expire (the leader's), and
each live process's presence (services/runtime/leadership.py). `clock_moves`: a clock advance or set asked of
the leader by another process, and its outcome.
"""

import sqlalchemy as sa
from alembic import op

import hyperplan.store.types

revision = "0017"
down_revision = "0013"
branch_labels = None
depends_on = None

COUNTERS = ("calendar", "keys", "settings", "events", "webhooks", "jobs", "nodes", "clock_moves")


def upgrade() -> None:
    counters = op.create_table(
        "change_counters",
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.bulk_insert(counters, [{"name": name, "value": 0} for name in COUNTERS])
    op.create_table(
        "leases",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("holder", sa.String(length=128), nullable=False),
        sa.Column("expires_at", hyperplan.store.types.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "clock_moves",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("target", hyperplan.store.types.UTCDateTime(), nullable=False),
        sa.Column("done", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("events_run", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )


def downgrade() -> None:
    op.drop_table("clock_moves")
    op.drop_table("leases")
    op.drop_table("change_counters")
