"""an index on the ledger's dates, for the retention of rows (issue 55)

The metering compaction (services/orchestration/metering_compaction.py) reads one UTC day of ledger
lines at a time; without an index on `at` each day would read the whole ledger. The usage report's
payments (services/plans/usage.py), which read the lines of a window by `at`, use it too. The deletes of
the retention of rows need nothing new: status events go by (entity_kind, entity_id), timed events by
subject and by (done, due_at, id), audit rows by (at, id), rate buckets by their key.

Revision ID: 0032
Revises: 0031
"""

from alembic import op

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_ledger_at", "ledger_entries", ["at"])


def downgrade() -> None:
    op.drop_index("ix_ledger_at", table_name="ledger_entries")
