"""One live run per study on an SQLite storage: ``knobtune run`` holds an exclusive lock on a
small file beside the database for as long as it runs. A second run of the same study is
refused in one line that names the holder, instead of failing the first run's live trial as
stale and measuring on the same machine at the same time.

The lock is ``flock(2)``: the kernel releases it when the holder exits, however it dies
(SIGKILL included), so a dead run never blocks the next. It is local to a machine (and not
reliable on network file systems): several machines share a study on PostgreSQL.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from knobtune.search.errors import UserError
from knobtune.search.storage.database import redact, sqlite_file


def lock_path(url: str, study_name: str) -> Path | None:
    """``<database>.<study>.lock`` beside an SQLite file; None for other storages."""
    database = sqlite_file(url)
    if database is None:
        return None
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", study_name)[:60]
    digest = hashlib.sha1(study_name.encode()).hexdigest()[:8]
    return database.with_name(f"{database.name}.{safe}-{digest}.lock")


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return "another process"
    since = time.strftime("%H:%M:%S", time.localtime(info["started"])) if info.get("started") else "?"
    return f"knobtune (pid {info.get('pid', '?')} on {info.get('host', '?')}, since {since})"


@contextlib.contextmanager
def hold(url: str, study_name: str) -> Iterator[Path | None]:
    """Hold the study's run lock (SQLite storages), or raise UserError naming who holds it."""
    path = lock_path(url, study_name)
    if path is None:
        yield None
        return
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UserError(
                f"study {study_name!r} on {redact(url)} is being run by {_holder(path)}: two runs would measure on "
                f"this machine at once and each would take the other's live trial for a dead one; wait for it to "
                f"finish, stop it (Ctrl-C), or give this run another --name") from None
        # the file may have been removed by a holder releasing it between our open and our lock
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}).encode())
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)
