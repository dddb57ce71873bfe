"""The database: SQLAlchemy models, sessions, migrations and the queries the CLI needs."""
from tunefw.store.session import Store, open_store, upgrade_store

__all__ = ["Store", "open_store", "upgrade_store"]
