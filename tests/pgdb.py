"""Fresh databases for the naming and concurrency tests: a SQLite file always, and a new
PostgreSQL database (created and dropped per test) when $TUNEFW_TEST_POSTGRES_URL names a
server."""
from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Iterator

import pytest
from sqlalchemy import create_engine, make_url

PG_ENV = "TUNEFW_TEST_POSTGRES_URL"


def _pg_database() -> Iterator[str]:
    base = make_url(os.environ[PG_ENV])
    name = f"tunefw_t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A new, empty PostgreSQL database (skips without $TUNEFW_TEST_POSTGRES_URL)."""
    if not os.environ.get(PG_ENV):
        pytest.skip(f"set {PG_ENV} to run on PostgreSQL")
    yield from _pg_database()


@pytest.fixture
def db_urls(tmp_path: Path) -> Iterator[list[str]]:
    """[a fresh SQLite URL] plus a fresh PostgreSQL one when a server is configured."""
    urls = [f"sqlite:///{tmp_path / 'rules.db'}"]
    if not os.environ.get(PG_ENV):
        yield urls
        return
    gen = _pg_database()
    urls.append(next(gen))
    try:
        yield urls
    finally:
        gen.close()
