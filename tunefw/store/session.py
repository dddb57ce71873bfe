"""Opening the database: engine (SQLite WAL + busy timeout), schema checks, migrations."""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, inspect
from sqlalchemy.orm import Session, sessionmaker

from tunefw.errors import UserError
from tunefw.store.files import (check_sqlite_path, creation_lock, optuna_tables, readonly_url,
                                shown_url, sqlite_path, sqlite_pragmas)
from tunefw.store.models import SCHEMA_VERSION, Meta

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
VERSION_TABLE = "tunefw_alembic_version"
DEFAULT_URL = "sqlite:///tunefw.db"
UPGRADE_HINT = "run `tunefw db upgrade`"


def resolve_url(url: str | None) -> str:
    """--db, else $TUNEFW_DB, else ./tunefw.db; a plain file path means that SQLite file."""
    url = url or os.environ.get("TUNEFW_DB") or DEFAULT_URL
    return url if "://" in url else f"sqlite:///{Path(url).expanduser().resolve()}"


def _engine(url: str, readonly: bool = False) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30})
        sqlite_pragmas(engine, query_only=readonly)
        return engine
    if readonly and url.startswith("postgresql"):
        return create_engine(url, pool_pre_ping=True,
                             execution_options={"postgresql_readonly": True})
    return create_engine(url, pool_pre_ping=True)


def alembic_config(engine: Engine, connection) -> AlembicConfig:
    """Alembic's configuration for tunefw's migrations on an open connection (what an upgrade
    runs with; tests upgrade frozen databases step by step with it)."""
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = connection
    return cfg


def _script() -> ScriptDirectory:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return ScriptDirectory.from_config(cfg)


def head_revision() -> str:
    """The newest migration's revision."""
    return _script().get_current_head()


def current_revision(engine: Engine) -> str | None:
    """The database's migration revision (None: no tunefw schema)."""
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        return ctx.get_current_revision()


def _upgrade(engine: Engine, target: str = "head") -> None:
    with engine.begin() as conn:
        command.upgrade(alembic_config(engine, conn), target)
    with Session(engine) as s, s.begin():
        s.merge(Meta(key="schema_version", value=str(SCHEMA_VERSION)))


class Store:
    """A database handle: one engine, a session factory, the URL for Optuna's storage."""

    def __init__(self, url: str, engine: Engine, readonly: bool = False,
                 created: bool = False) -> None:
        self.url = url
        self.engine = engine
        self.readonly = readonly
        self.created = created  # this call made the database (the CLI says where)
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One transaction: committed on success, rolled back on any error."""
        with self._sessions() as s, s.begin():
            yield s

    def close(self) -> None:
        """Release the engine's connections."""
        self.engine.dispose()


def _schema_state(engine: Engine) -> str:
    """'empty' (no tunefw tables), 'current', 'older', or 'unknown'."""
    tables = set(inspect(engine).get_table_names())
    if VERSION_TABLE not in tables:
        return "unknown" if any(t.startswith("tunefw_") for t in tables) else "empty"
    rev = current_revision(engine)
    if rev == head_revision():
        return "current"
    known = {r.revision for r in _script().walk_revisions()}
    return "older" if rev in known else "unknown"


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _settle(url: str, engine: Engine, create: bool) -> tuple[str, bool]:
    """The schema state seen under the creation lock (another process may be creating the
    schema right now), creating it if empty and ``create``; returns (state, created)."""
    with creation_lock(url, engine):
        state = _schema_state(engine)
        if state != "empty" or not create:
            return state, False
        _upgrade(engine)
        optuna_tables(url)
        return "current", True


def open_store(url: str | None = None, create: bool = True, readonly: bool = False) -> Store:
    """Open the database (``create``: make it if missing, else a missing one is an error;
    ``readonly``: never write, never create); refuse an older or unknown schema."""
    url = resolve_url(url)
    where = shown_url(url)
    readonly = readonly and not create
    path = sqlite_path(url)
    if path is not None:
        check_sqlite_path(url, path, create, write=not readonly)
    try:
        engine = _engine(readonly_url(url) if readonly else url, readonly)
        state = _schema_state(engine)
    except UserError:
        raise
    except Exception as exc:  # bad URL, unreadable file, not a database
        raise UserError(f"--db {where}: cannot open database ({_first_line(exc)})") from None
    created = False
    if state != "current" and not readonly:
        try:
            state, created = _settle(url, engine, create)
        except Exception as exc:  # a read-only file or directory, a full disk
            engine.dispose()
            raise UserError(f"--db {where}: cannot create the database ({_first_line(exc)})") \
                from None
    if state == "empty":
        engine.dispose()
        raise UserError(f"--db {where}: no tunefw database there "
                        "(`tunefw study create` makes one)")
    elif state == "older":
        engine.dispose()
        raise UserError(f"database {where} has an older tunefw schema "
                        f"({current_revision(engine)}); {UPGRADE_HINT}")
    elif state == "unknown":
        engine.dispose()
        raise UserError(f"database {where} has an unknown or newer schema (not {head_revision()}); "
                        f"this tunefw cannot use it ({UPGRADE_HINT} only upgrades known older "
                        "ones)")
    if url.startswith("sqlite") and not readonly:  # persistent in the file; once the schema is ours
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA journal_mode=WAL")
        except Exception as exc:  # a read-only file: writing commands fail here, in one line
            engine.dispose()
            raise UserError(f"--db {where}: cannot write ({_first_line(exc)})") from None
    return Store(url, engine, readonly=readonly, created=created)


def upgrade_store(url: str | None = None) -> tuple[str | None, str]:
    """`tunefw db upgrade`: migrate a known older schema to head; returns (from, to). Never
    creates a database: a missing file or one without tunefw's tables is an error."""
    url = resolve_url(url)
    where = shown_url(url)
    path = sqlite_path(url)
    if path is not None:
        check_sqlite_path(url, path, create=False)
    try:
        engine = _engine(url)
    except Exception as exc:
        raise UserError(f"--db {where}: cannot open database ({_first_line(exc)})") from None
    try:
        try:
            state = _schema_state(engine)
        except Exception as exc:
            raise UserError(f"--db {where}: cannot open database ({_first_line(exc)})") from None
        if state == "empty":
            raise UserError(f"--db {where}: no tunefw database there; nothing to upgrade")
        if state == "unknown":
            raise UserError(f"database {where} has an unknown or newer schema; "
                            "refusing to touch it")
        before = current_revision(engine)
        if state == "older":
            try:
                _upgrade(engine)
            except Exception as exc:
                raise UserError(f"--db {where}: cannot upgrade ({_first_line(exc)})") from None
        return before, head_revision()
    finally:
        engine.dispose()
