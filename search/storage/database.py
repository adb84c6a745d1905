"""Storage URLs: resolve, redact, open. SQLite is the embedded default (one writer); the
engine waits on a locked database and uses a WAL journal so the dashboard can read a live study.
"""
from __future__ import annotations

import os
import re
import sqlite3
import time
from pathlib import Path
from typing import Any

from knobtune.search.errors import UserError

DEFAULT_URL = "sqlite:///knobtune.db"
SQLITE_TIMEOUT_S = 60
_SCHEMA_ATTEMPTS = 5
_DRIVER_HINTS = {
    "postgresql": "pip install 'knobtune[postgres]' (psycopg 3)",
    "mysql": "pip install pymysql (and use mysql+pymysql://)",
}


def resolve_url(cli: str | None = None, study_file: str | None = None) -> str:
    """--storage, else $KNOBTUNE_STORAGE, else the study file's [study] storage, else the default."""
    return cli or os.environ.get("KNOBTUNE_STORAGE") or study_file or DEFAULT_URL


def redact(url: str) -> str:
    """The URL with any password replaced by ***, even when the URL does not parse."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def scrub(text: str, url: str) -> str:
    """``text`` with the URL's password (and the URL itself) redacted."""
    match = re.search(r"://[^:/@]*:([^@]*)@", url)
    if match and match.group(1):
        text = text.replace(match.group(1), "***")
    return text.replace(url, redact(url))


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def sqlite_file(url: str) -> Path | None:
    """The database file of an SQLite URL; None for other storages and in-memory SQLite."""
    if not is_sqlite(url):
        return None
    from sqlalchemy.engine import make_url

    database = make_url(url).database
    return Path(database) if database and database != ":memory:" else None


def _prepare_sqlite(url: str) -> None:
    from sqlalchemy.engine import make_url

    database = make_url(url).database
    if not database or database == ":memory:":
        raise UserError(f"storage {url}: an in-memory SQLite database cannot hold a study; name a file")
    path = Path(database)
    if not path.parent.exists():
        hint = "" if path.is_absolute() else " (the path is relative to the current directory; sqlite:////abs/path is absolute)"
        raise UserError(f"storage {url}: directory {path.parent} does not exist{hint}")
    try:
        with sqlite3.connect(path, timeout=SQLITE_TIMEOUT_S) as conn:
            _wal(conn)
    except sqlite3.DatabaseError as exc:
        raise UserError(f"storage {url}: {path} is not a usable SQLite database ({exc})") from None


def _wal(conn: sqlite3.Connection, attempts: int = 40, pause_s: float = 0.25) -> None:
    """Switch the file to a WAL journal (it persists in the file; readers then no longer block
    the writer). The switch needs the file to itself, and SQLite does not wait for that: while
    another process has it open (the dashboard, a second run creating the schema), retry for a
    while, then go on without it (the engine's connections wait on locks anyway)."""
    if str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal":
        return
    for _ in range(attempts):
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            time.sleep(pause_s)


def open_storage(url: str, sharing: Any = None):
    """An Optuna RDBStorage for ``url``; raises UserError (password redacted) when it cannot.
    ``sharing`` (search.workers.Sharing) turns on heartbeats for trials: a silent worker's running
    trial is failed after the grace period and its configuration queued again."""
    import optuna
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, IntegrityError, ProgrammingError, SQLAlchemyError

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise UserError(
            f"storage URL {redact(url)!r} is malformed: expected an SQLAlchemy URL such as "
            f"sqlite:///knobtune.db or postgresql://user:password@host/dbname"
        ) from None
    engine_kwargs: dict[str, object]
    if is_sqlite(url):
        _prepare_sqlite(url)
        engine_kwargs = {"connect_args": {"timeout": SQLITE_TIMEOUT_S}}
    else:
        engine_kwargs = {"pool_pre_ping": True}
        if parsed.get_backend_name() in ("postgresql", "mysql"):
            engine_kwargs["connect_args"] = {"connect_timeout": 10}
        if parsed.get_backend_name() == "postgresql":
            # a database host that vanishes sends no reset: without keepalives a query in flight would
            # wait for the kernel's TCP timeout (about 15 minutes) instead of failing into the retries
            engine_kwargs["connect_args"] = {"connect_timeout": 10, "keepalives": 1, "keepalives_idle": 10,
                                             "keepalives_interval": 5, "keepalives_count": 3,
                                             "tcp_user_timeout": 30000}
    for attempt in range(_SCHEMA_ATTEMPTS):
        try:
            if sharing is None:
                return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
            return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, heartbeat_interval=sharing.heartbeat_s,
                                              grace_period=sharing.grace_s)
        except ImportError as exc:  # Optuna wraps the driver's ModuleNotFoundError
            missing = getattr(exc.__cause__, "name", None) or getattr(exc, "name", None) or "?"
            hint = _DRIVER_HINTS.get(parsed.get_backend_name(), "install its SQLAlchemy driver")
            raise UserError(f"storage {redact(url)}: its driver module {missing!r} is not installed ({hint})") from None
        except (IntegrityError, ProgrammingError) as exc:
            # workers starting together on an empty database each create Optuna's tables; the
            # losers of that race see a duplicate catalogue entry: the tables exist now, open again
            if attempt + 1 < _SCHEMA_ATTEMPTS and ("already exists" in str(exc) or "duplicate key" in str(exc)):
                time.sleep(0.2 * (attempt + 1))
                continue
            raise _cannot_open(url, exc) from exc
        except (SQLAlchemyError, OSError, ValueError) as exc:
            raise _cannot_open(url, exc) from exc  # (the cause tells search.workers a lost connection)
    raise AssertionError("unreachable")


def _cannot_open(url: str, exc: BaseException) -> UserError:
    reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return UserError(f"cannot open storage {redact(url)}: {scrub(reason[0] if reason else type(exc).__name__, url)}")
