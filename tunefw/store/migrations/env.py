"""Alembic environment: runs tunefw's migrations on the connection tunefw hands it."""
from alembic import context

from tunefw.store.models import Base

VERSION_TABLE = "tunefw_alembic_version"

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata,
                  version_table=VERSION_TABLE, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
