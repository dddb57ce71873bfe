"""The launch lease: a launch holds its study's one lease row (host, pid, since, last beat)
while it runs, so a second launch of the study is refused and a dead launch's lease is taken
over. Taking it is one atomic statement on SQLite and PostgreSQL alike: an INSERT of the row
(the study id is its key, so of two INSERTs one fails), or over a stale row an UPDATE on the
condition that the row is still the one judged stale (the same token and beat count)."""
from __future__ import annotations

import os
import socket
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import Connection, Engine, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session

from tunefw.errors import UserError
from tunefw.store.models import LaunchLease

TIMEOUT_S = 60.0  # a lease with no beat for this long is stale
BEATS_PER_TIMEOUT = 6  # a beat every TIMEOUT_S / 6: five in a row can fail before it goes stale
ATTEMPTS = 5  # inserts and takeovers tried before giving up on a lease that keeps changing
TABLE = LaunchLease.__table__


@dataclass(frozen=True)
class Holder:
    """A lease as stored: who holds it, since when, its last beat and its timeout."""

    token: str
    host: str
    pid: int
    started_at: datetime
    beat_at: datetime
    beats: int
    timeout_s: float

    def named(self) -> str:
        """'host pid N since YYYY-MM-DD HH:MM:SS UTC', as the messages name a holder."""
        return f"{self.host} pid {self.pid} since {self.started_at:%Y-%m-%d %H:%M:%S} UTC"

    def stale(self, now: datetime, host: str | None = None) -> str | None:
        """Why the holder is gone (no beat within its timeout, or its process is no more on
        this host), or None while it is live."""
        quiet = (now - self.beat_at).total_seconds()
        if quiet > self.timeout_s:
            return f"no heartbeat for {quiet:.0f} s (timeout {self.timeout_s:g} s)"
        if self.host == (host or socket.gethostname()) and not pid_alive(self.pid):
            return "its process is gone"
        return None


def pid_alive(pid: int) -> bool:
    """Whether a process of that id runs on this host (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _aware(when: datetime) -> datetime:
    """A lease time in UTC (SQLite hands back naive ones, stored in UTC; PostgreSQL's come in
    the session's time zone)."""
    return when.astimezone(timezone.utc) if when.tzinfo else when.replace(tzinfo=timezone.utc)


def db_now(conn: Connection) -> datetime:
    """The clock leases are judged by: the server's on PostgreSQL (hosts of one database may
    disagree on the time), this host's for a SQLite file."""
    if conn.dialect.name == "postgresql":
        return _aware(conn.scalar(select(func.now())))
    return datetime.now(timezone.utc)


def holder_of(conn: Connection, study_id: int) -> Holder | None:
    """The study's lease row, or None."""
    row = conn.execute(select(TABLE).where(TABLE.c.study_id == study_id)).mappings().first()
    if row is None:
        return None
    return Holder(row["token"], row["host"], row["pid"], _aware(row["started_at"]),
                  _aware(row["beat_at"]), row["beats"], row["timeout_s"])


def live_holder(s: Session, study_id: int) -> Holder | None:
    """The study's lease holder while it is live, else None (no lease, or a stale one)."""
    conn = s.connection()
    holder = holder_of(conn, study_id)
    return holder if holder is not None and holder.stale(db_now(conn)) is None else None


def held_message(name: str, holder: Holder, now: datetime) -> str:
    """What a refused launch (or delete) says: the study and who holds it."""
    return (f"study {name!r} is being launched by {holder.named()} (last heartbeat "
            f"{(now - holder.beat_at).total_seconds():.0f} s ago); wait for it to end or stop it")


class LeaseLost(UserError):
    """This launch's lease is no longer its own (taken over, or the study deleted)."""


class Lease:
    """A lease this process holds: beat by a thread every timeout / BEATS_PER_TIMEOUT, fenced
    into each write of the launch (fence), released on exit however the launch ends."""

    def __init__(self, engine: Engine, study_id: int, name: str, token: str, timeout_s: float,
                 took_over: tuple[Holder, str] | None = None) -> None:
        self.engine = engine
        self.study_id = study_id
        self.name = name
        self.token = token
        self.timeout_s = timeout_s
        self.took_over = took_over  # the stale holder this launch replaced, and why it was stale
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat_until_stopped, daemon=True,
                                        name=f"tunefw-lease-{study_id}")

    def takeover_line(self) -> str | None:
        """One line saying whose stale lease this launch took over, or None."""
        if self.took_over is None:
            return None
        old, why = self.took_over
        return f"study {self.name}: took over the launch lease of {old.named()}: {why}"

    def _touch(self, conn: Connection) -> bool:
        """One beat: True while the row is still this launch's."""
        done = conn.execute(update(TABLE).where(TABLE.c.study_id == self.study_id,
                                                TABLE.c.token == self.token)
                            .values(beat_at=db_now(conn), beats=TABLE.c.beats + 1))
        return done.rowcount == 1

    def beat(self) -> bool:
        """Beat now, in a transaction of its own; False once the lease is lost."""
        with self.engine.begin() as conn:
            return self._touch(conn)

    def fence(self, s: Session) -> None:
        """Beat inside the caller's transaction, first: its writes commit only while this
        launch holds the lease (on PostgreSQL the row stays locked until they do)."""
        conn = s.connection()
        if self._touch(conn):
            return
        now = holder_of(conn, self.study_id)
        who = f" by {now.named()}" if now is not None else ""
        raise LeaseLost(f"study {self.name!r}: this launch's lease was taken over{who}; it "
                        "stopped, and trials in flight were discarded")

    def _beat_until_stopped(self) -> None:
        while not self._stop.wait(self.timeout_s / BEATS_PER_TIMEOUT):
            try:
                if not self.beat():
                    return  # lost: the next fenced write stops the launch
            except SQLAlchemyError:
                continue  # the database was out of reach for a beat; the next one may land

    def start(self) -> "Lease":
        """Start beating."""
        self._thread.start()
        return self

    def __enter__(self) -> "Lease":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        """Stop beating and delete the row (if still this launch's)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        try:
            with self.engine.begin() as conn:
                conn.execute(delete(TABLE).where(TABLE.c.study_id == self.study_id,
                                                 TABLE.c.token == self.token))
        except SQLAlchemyError:
            pass  # out of reach: the row goes stale by its timeout (or its dead pid)


def take(engine: Engine, study_id: int, name: str, timeout_s: float = TIMEOUT_S) -> Lease:
    """Take the study's lease (not yet beating: enter the Lease to start): insert its row, or
    take over a stale one; a live holder is a UserError naming it."""
    token = uuid.uuid4().hex
    mine = {"token": token, "host": socket.gethostname(), "pid": os.getpid(),
            "timeout_s": timeout_s, "beats": 0}
    for _ in range(ATTEMPTS):
        try:
            with engine.begin() as conn:
                now = db_now(conn)
                conn.execute(insert(TABLE).values(study_id=study_id, started_at=now,
                                                  beat_at=now, **mine))
            return Lease(engine, study_id, name, token, timeout_s)
        except IntegrityError:
            pass  # the study has a lease row: judge it
        with engine.begin() as conn:
            now = db_now(conn)
            old = holder_of(conn, study_id)
            if old is None:
                continue  # released meanwhile: insert again
            why = old.stale(now, mine["host"])
            if why is None:
                raise UserError(held_message(name, old, now))
            taken = conn.execute(update(TABLE).where(
                TABLE.c.study_id == study_id, TABLE.c.token == old.token,
                TABLE.c.beats == old.beats).values(started_at=now, beat_at=now, **mine))
            if taken.rowcount == 1:
                return Lease(engine, study_id, name, token, timeout_s, took_over=(old, why))
    raise UserError(f"study {name!r}: its launch lease kept changing hands; launch again")
