"""Alembic environment: the connection comes from hyperplan.store.db.Database.migrate()."""

from alembic import context

from hyperplan.store.schema import Base

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=True,  # SQLite alters tables by copying them
)
with context.begin_transaction():
    context.run_migrations()
