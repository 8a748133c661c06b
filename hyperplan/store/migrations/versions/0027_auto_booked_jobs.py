"""training jobs that book their own capacity: the request, and the plan each books

Revision ID: 0027
Revises: 0026

A job made before this revision named its plan or ran on demand: it has no auto-book request and books
nothing (both columns NULL).
"""

import sqlalchemy as sa
from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("training_jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("auto_book", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("auto_book_plan", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("training_jobs", schema=None) as batch_op:
        batch_op.drop_column("auto_book_plan")
        batch_op.drop_column("auto_book")
