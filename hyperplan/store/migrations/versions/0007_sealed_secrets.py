"""sealed secrets: access-key and webhook secrets stored encrypted under the master key

Revision ID: 0007
Revises: 0006

A migration cannot know the master key (it lives in a file only the running server reads), so this one
only marks every existing secret as plain text (`secret_sealed` false). The server's start step
(hyperplan/services/accounts/sealed_secrets.py, called by Application.open right after the migration) seals
every marked secret under the key in one transaction, then compacts the database file so that no page keeps
the plain text.
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# A Fernet token of a secret is longer than the secret: 140 characters for a 40-character access-key
# secret. SQLite ignores VARCHAR lengths; other databases need the room.
SEALED_LENGTH = 512


def upgrade() -> None:
    for table, column in (("access_keys", "secret_access_key"), ("webhooks", "secret")):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(
                sa.Column("secret_sealed", sa.Boolean(), nullable=False, server_default=sa.false())
            )
            if op.get_bind().dialect.name != "sqlite":
                batch_op.alter_column(column, type_=sa.String(length=SEALED_LENGTH))


def downgrade() -> None:
    # Sealed secrets cannot go back to plain text without the key: refuse rather than lose every key.
    raise NotImplementedError("secrets sealed under the master key cannot be migrated back to plain text")
