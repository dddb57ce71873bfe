"""What the CLI's commands share: their consoles and the database the --db option names
(opened per command, closed when it ends)."""
from __future__ import annotations

import functools
import inspect
from typing import Callable, Optional, TypeVar

import typer
from rich.console import Console

from tunefw.cli.console import console
from tunefw.store import Store

out = console()
err = Console(stderr=True, highlight=False, soft_wrap=True)
state: dict = {"db": None, "stores": []}

DB_HELP = ("Database: a SQLAlchemy URL or a SQLite file path; default $TUNEFW_DB or "
           "sqlite:///tunefw.db.")
JSON_HELP = "Machine-readable output (the same data)."
Command = TypeVar("Command", bound=Callable)


def takes_db(command: Command) -> Command:
    """The command gets its own ``--db URL`` (listed in its --help; typed after the subcommand,
    where people type it), beside the one before the subcommand; the later one wins."""
    signature = inspect.signature(command)
    db = inspect.Parameter("db", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[str],
                           default=typer.Option(None, "--db", help=DB_HELP, metavar="URL"))

    @functools.wraps(command)
    def with_db(*args, db: Optional[str] = None, **kwargs):
        if db is not None:
            state["db"] = db
        return command(*args, **kwargs)

    with_db.__signature__ = signature.replace(parameters=[*signature.parameters.values(), db])
    return with_db  # type: ignore[return-value]


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
