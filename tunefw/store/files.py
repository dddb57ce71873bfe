"""Where the database lives: SQLite paths checked before SQLite touches them, read-only URLs,
one creator at a time (schema and Optuna's tables), and Optuna's storage in the same database."""
from __future__ import annotations

import fcntl
import os
import zlib
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Iterator
from urllib.parse import quote

import optuna
from sqlalchemy import Engine, event, make_url

from tunefw.errors import UserError

# pg_advisory_lock key of schema creation (any constant; the same in every tunefw process)
_PG_LOCK = zlib.crc32(b"tunefw schema creation")


def shown_url(url: str) -> str:
    """The URL as messages show it: any password masked."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not parseable: shown as given, minus anything after an '@'
        return url.split("@")[-1]


def sqlite_path(url: str) -> Path | None:
    """The file of a sqlite:/// URL (None for other databases and in-memory SQLite)."""
    if not url.startswith("sqlite:///"):
        return None
    rest = url.removeprefix("sqlite:///").split("?", 1)[0]
    if rest in ("", ":memory:") or rest.startswith("file:"):
        return None
    return Path(rest)


def check_sqlite_path(url: str, path: Path, create: bool, write: bool = True) -> None:
    """Refuse what SQLite would mishandle: a device or directory, a missing file (unless
    creating), a missing directory, a read-only file for a command that writes."""
    if path.exists():
        if not path.is_file():
            raise UserError(f"--db {path}: not a regular file (a SQLite database file or a URL)")
        if write and not (os.access(path, os.W_OK) and os.access(path.resolve().parent, os.W_OK)):
            raise UserError(f"--db {path}: read-only (file or directory); this command writes "
                            "(the read-only ones: study list/show, export, report, trial show, "
                            "status)")
        return
    if not create:
        raise UserError(f"--db {path}: no such database file (`tunefw study create` makes one)")
    if not path.parent.is_dir():
        raise UserError(f"--db {shown_url(url)}: directory {path.parent} does not exist")


def readonly_url(url: str) -> str:
    """The URL a read-only command opens: the same one where the file and its directory are
    writable (the engine then sets PRAGMA query_only, and closing it leaves no -wal/-shm
    behind), else SQLite's read-only, immutable mode (a read-only file or mount, where no -shm
    can be made)."""
    path = sqlite_path(url)
    if path is None or (os.access(path, os.W_OK) and os.access(path.resolve().parent, os.W_OK)):
        return url
    return f"sqlite:///file:{quote(str(path.resolve()))}?mode=ro&immutable=1&uri=true"


@contextmanager
def creation_lock(url: str, engine: Engine) -> Iterator[None]:
    """Hold the database's creation lock: an advisory lock on PostgreSQL, flock on a SQLite
    file; concurrent first uses then create the tables one after the other."""
    path = sqlite_path(url)
    if path is not None:  # lock the directory: closing a descriptor of the database file itself
        fd = os.open(path.resolve().parent, os.O_RDONLY)  # would drop SQLite's own locks
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)
        return
    if engine.dialect.name != "postgresql":
        with nullcontext():
            yield
        return
    with engine.connect() as conn:
        conn.exec_driver_sql(f"SELECT pg_advisory_lock({_PG_LOCK})")
        try:
            yield
        finally:
            conn.exec_driver_sql(f"SELECT pg_advisory_unlock({_PG_LOCK})")


def _rdb(url: str) -> optuna.storages.RDBStorage:
    if not url.startswith("sqlite"):
        return optuna.storages.RDBStorage(url)
    storage = optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 30}})
    sqlite_pragmas(storage.engine)
    storage.engine.dispose()  # connections opened before the pragmas are dropped
    return storage


def optuna_tables(url: str) -> None:
    """Create Optuna's tables (so optuna-dashboard opens the database before any launch)."""
    _rdb(url).engine.dispose()


def optuna_storage(url: str, engine: Engine) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage in the same database (its own tables, no tunefw_ prefix); a database
    made before Optuna's tables were created up front gets them under the creation lock."""
    with creation_lock(url, engine):
        return _rdb(url)


def sqlite_pragmas(engine: Engine, query_only: bool = False) -> None:
    """Per connection: wait for locks instead of failing, enforce foreign keys, and in WAL mode
    fsync at checkpoints only (an application crash loses nothing; a power cut may lose the
    last transactions, which a resumed launch re-runs); ``query_only``: refuse every write."""

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn, _record) -> None:
        cur = dbapi_conn.cursor()
        if query_only:
            cur.execute("PRAGMA query_only=ON")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()
