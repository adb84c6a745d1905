"""A real PostgreSQL server for the tests of workers on a shared study.

It runs the system's PostgreSQL (Debian package ``postgresql``; ``.ci/run`` installs it) from a
fresh data directory on a free loopback port, with a password, as the ``postgres`` user when the
tests run as root (PostgreSQL refuses to run as root). A test that needs it is skipped, with the
reason, when the server or the ``psycopg`` driver cannot be had.

    with PostgresServer() as server:
        url = server.database("mytest")   # postgresql://knobtune:...@127.0.0.1:PORT/mytest
        ...
        server.stop()                     # the database goes away (a test of losing it)
"""
from __future__ import annotations

import glob
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

USER, PASSWORD = "knobtune", "pg-s3cret-pw"


def _binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """A throwaway PostgreSQL cluster: ``start()``, ``database(name)`` for a URL, ``stop()``."""

    def __init__(self) -> None:
        if importlib.util.find_spec("psycopg") is None:
            pytest.skip("the psycopg driver is not installed (pip install 'knobtune[postgres]')")
        self.initdb, self.pg_ctl = _binary("initdb"), _binary("pg_ctl")
        if not self.initdb or not self.pg_ctl:
            pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) on PATH or in /usr/lib/postgresql/*/bin "
                        "(Debian: apt-get install postgresql)")
        self.as_user: list[str] = []
        self.owner: pwd.struct_passwd | None = None
        if os.geteuid() == 0:  # PostgreSQL refuses root: run it as the postgres user
            try:
                self.owner = pwd.getpwnam("postgres")
            except KeyError:
                pytest.skip("running as root and there is no 'postgres' user to run the server as")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self.root = Path(tempfile.mkdtemp(prefix="knobtune-pg-"))
        self.data, self.log = self.root / "data", self.root / "server.log"
        self.port = 0
        self.running = False

    def _own(self, *paths: Path) -> None:
        if self.owner is not None:
            for path in paths:
                os.chown(path, self.owner.pw_uid, self.owner.pw_gid)

    def _run(self, *argv: str) -> None:
        proc = subprocess.run([*self.as_user, *argv], capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}\n"
                               f"{self.log.read_text()[-2000:] if self.log.exists() else ''}")

    def start(self) -> PostgresServer:
        self._own(self.root)
        if not self.data.exists():
            pwfile = self.root / "pw"
            pwfile.write_text(PASSWORD + "\n")
            self._own(pwfile)
            self._run(self.initdb, "-D", str(self.data), "-U", USER, "--pwfile", str(pwfile),
                      "--auth", "scram-sha-256", "-E", "UTF8", "--no-sync")
        self.port = self.port or _free_port()
        options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                   f"-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        self._run(self.pg_ctl, "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60", "start")
        self.running = True
        return self

    def stop(self) -> None:
        """Stop at once, as a database host that goes away would (connections are cut)."""
        if self.running:
            self._run(self.pg_ctl, "-D", str(self.data), "-m", "immediate", "-w", "stop")
            self.running = False

    def url(self, database: str = "postgres", password: str = PASSWORD) -> str:
        return f"postgresql://{USER}:{password}@127.0.0.1:{self.port}/{database}"

    def database(self, name: str) -> str:
        """A new, empty database on this server, and its URL."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
