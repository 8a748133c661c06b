"""containers: the digest of the image each job ran, and instances that ran out of memory

Revision ID: 0024
Revises: 0023
"""

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Jobs run before containers ran no image: NULL. Instances before: none is known to have run out.
    with op.batch_alter_table("training_jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("image_digest", sa.String(length=160), nullable=True))
    with op.batch_alter_table("training_job_instances", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("out_of_memory", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("training_job_instances", schema=None) as batch_op:
        batch_op.drop_column("out_of_memory")
    with op.batch_alter_table("training_jobs", schema=None) as batch_op:
        batch_op.drop_column("image_digest")
