"""Leases: a named piece of work that one process of many does, on the study's own database.

Workers on several machines share nothing but the database, so "exactly one of us confirms the
winner" is a row in a small table of knobtune's (``knobtune_leases``) beside Optuna's: the first
INSERT wins (the primary key refuses the others); the holder renews it while it works; a lease not
renewed for ``ttl`` seconds (its holder died, its machine vanished) can be taken over. Times are the
database server's clock, so the workers' clocks need not agree.
"""
from __future__ import annotations

import contextlib
import datetime
import threading
import time
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

from knobtune.search.errors import RunError

_META = sa.MetaData()
LEASES = sa.Table(
    "knobtune_leases", _META,
    sa.Column("name", sa.String(255), primary_key=True),
    sa.Column("holder", sa.String(255), nullable=False),
    sa.Column("renewed", sa.DateTime, nullable=False),
)


def _now(conn: sa.Connection) -> datetime.datetime:
    # (naive, as Optuna's heartbeats: PostgreSQL returns an aware time, SQLite a naive one)
    return conn.execute(sa.select(sa.func.now())).scalar_one().replace(tzinfo=None)


class Lease:
    """The lease ``name`` on ``engine`` for ``holder``: ``claim()`` it, ``renew()`` it while
    working (or ``keep()`` a thread doing so), ``release()`` it when done."""

    def __init__(self, engine: sa.Engine, name: str, holder: str, ttl_s: float) -> None:
        self.engine, self.name, self.holder, self.ttl = engine, name, holder, datetime.timedelta(seconds=ttl_s)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            _META.create_all(engine, checkfirst=True)
        except (IntegrityError, ProgrammingError, OperationalError):
            # another process created it between the check and the CREATE (PostgreSQL reports the
            # clash as a unique violation on its catalogue); anything else fails below, on first use
            pass

    def claim(self) -> str | None:
        """Take the lease: None when this holder has it now, else who holds it."""
        try:
            with self.engine.begin() as conn:
                conn.execute(sa.insert(LEASES).values(name=self.name, holder=self.holder, renewed=_now(conn)))
            return None
        except IntegrityError:
            pass  # held, or held once: take it over if its holder stopped renewing it
        with self.engine.begin() as conn:
            now = _now(conn)
            taken = conn.execute(
                sa.update(LEASES)
                .where(LEASES.c.name == self.name)
                .where(sa.or_(LEASES.c.holder == self.holder, LEASES.c.renewed < now - self.ttl))
                .values(holder=self.holder, renewed=now)
            ).rowcount
            if taken == 1:
                return None
            row = conn.execute(sa.select(LEASES.c.holder).where(LEASES.c.name == self.name)).first()
            return row.holder if row else "another process"

    def renew(self) -> bool:
        """Push the expiry on; False when the lease was lost (taken over after a long stall)."""
        with self.engine.begin() as conn:
            return conn.execute(
                sa.update(LEASES).where(LEASES.c.name == self.name).where(LEASES.c.holder == self.holder)
                .values(renewed=_now(conn))
            ).rowcount == 1

    def keep(self) -> None:
        """Renew in a background thread every third of the ttl until ``release()``."""
        def loop() -> None:
            while not self._stop.wait(self.ttl.total_seconds() / 3):
                try:
                    self.renew()
                except Exception:  # noqa: BLE001 - the database is away for a moment: try again later
                    pass
        self._thread = threading.Thread(target=loop, name="knobtune-lease", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Give the lease up (and stop renewing it); the object can claim it again later."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._stop.clear()
        with self.engine.begin() as conn:
            conn.execute(sa.delete(LEASES).where(LEASES.c.name == self.name).where(LEASES.c.holder == self.holder))

    @contextlib.contextmanager
    def held(self, patience_s: float = 120.0, poll_s: float = 0.2) -> Iterator[Lease]:
        """Claim the lease, waiting while another process holds it (for short pieces of work:
        setting a study up, asking for a trial, re-queueing one), and release it after."""
        deadline = time.monotonic() + patience_s
        while (holder := self.claim()) is not None:
            if time.monotonic() > deadline:
                raise RunError(f"{holder} has held {self.name!r} for over {patience_s:g} s; if it is dead, its lease "
                               f"expires {self.ttl.total_seconds():g} s after its last renewal: run again then")
            time.sleep(poll_s)
        try:
            yield self
        finally:
            self.release()

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001 - the lease expires on its own
            pass
