"""training images: the reference each job's image resolved to, and registry credentials sealed under the
master key

Revision ID: 0023
Revises: 0022
"""

import sqlalchemy as sa
from alembic import op

from hyperplan.store.types import UTCDateTime

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Jobs made before have no resolution recorded: NULL, as for a job without a TrainingImage.
    with op.batch_alter_table("training_jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("resolved_image", sa.Text(), nullable=True))
    # Empty at first: credentials are set by an administrator, each password sealed as it is stored.
    op.create_table(
        "registry_credentials",
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("username", sa.String(length=255), nullable=False),
        sa.Column("password", sa.Text(), nullable=False),
        sa.Column("set_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("host"),
    )


def downgrade() -> None:
    op.drop_table("registry_credentials")
    with op.batch_alter_table("training_jobs", schema=None) as batch_op:
        batch_op.drop_column("resolved_image")
