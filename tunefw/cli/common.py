"""What the CLI's commands share: their consoles and the database the --db option names
(opened per command, closed when it ends)."""
from __future__ import annotations

from rich.console import Console

from tunefw.cli.console import console
from tunefw.store import Store

out = console()
err = Console(stderr=True, highlight=False, soft_wrap=True)
state: dict = {"db": None, "stores": []}

DB_HELP = ("Database: a SQLAlchemy URL or a SQLite file path; default $TUNEFW_DB or "
           "sqlite:///tunefw.db.")


def open_db(mode: str = "read") -> Store:
    """Open the database: "read" (read-only, never creates), "write" (must exist) or "create"
    (made if missing; says where)."""
    from tunefw.store import open_store
    store = open_store(state["db"], create=mode == "create", readonly=mode == "read")
    state["stores"].append(store)  # closed when the command ends (close_all)
    if store.created:
        from tunefw.store.files import shown_url
        err.print(f"created database {shown_url(store.url)}", markup=False)
    return store


def close_all() -> None:
    """Close every database the command opened."""
    while state["stores"]:
        state["stores"].pop().close()
