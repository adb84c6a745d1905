"""Storage URLs: defaults, bad and unreachable ones, no password ever printed."""
from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from knobtune.search.errors import UserError
from knobtune.search.storage.database import DEFAULT_URL, open_storage, redact, resolve_url

from conftest import knobtune


def test_resolution_order(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("KNOBTUNE_STORAGE", raising=False)
    assert resolve_url() == DEFAULT_URL
    assert resolve_url(None, "sqlite:///a.db") == "sqlite:///a.db"
    monkeypatch.setenv("KNOBTUNE_STORAGE", "sqlite:///env.db")
    assert resolve_url(None, "sqlite:///a.db") == "sqlite:///env.db"
    assert resolve_url("sqlite:///cli.db", "sqlite:///a.db") == "sqlite:///cli.db"


def test_redact():
    assert redact("postgresql://bob:s3cr:et@db:5432/x") == "postgresql://bob:***@db:5432/x"
    assert redact("sqlite:///knobtune.db") == "sqlite:///knobtune.db"


def test_sqlite_is_opened_in_wal_mode(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'k.db'}"
    open_storage(url)
    with sqlite3.connect(tmp_path / "k.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


@pytest.mark.parametrize(
    "url, expected",
    [
        ("not a url", "is malformed"),
        ("sqlite:////no/such/dir/k.db", "directory /no/such/dir does not exist"),
        ("postgresql://bob:hunter2@127.0.0.1:9/knobtune", "cannot open storage postgresql://bob:***@127.0.0.1:9/knobtune"),
        ("mysql://bob:hunter2@127.0.0.1:9/knobtune", "driver module"),
    ],
)
def test_bad_storage_is_a_clear_error_without_the_password(url: str, expected: str):
    with pytest.raises(UserError) as info:
        open_storage(url)
    assert expected in str(info.value) and "hunter2" not in str(info.value)


def test_cli_unreachable_storage_exit_2_no_password(tmp_path: Path):
    proc = knobtune("export", "x", "--storage", "postgresql://bob:hunter2@127.0.0.1:9/kt", cwd=tmp_path, check=2)
    assert "hunter2" not in proc.stderr + proc.stdout
    assert len(proc.stderr.strip().splitlines()) == 1 and "bob:***@" in proc.stderr


def test_opening_while_another_process_reads_the_file_waits_for_wal(tmp_path: Path):
    # the dashboard (or a test) reading the file as `knobtune run` starts: the switch to WAL needs
    # the file to itself, so the run retries until the reader is gone instead of failing
    import threading

    path = tmp_path / "busy.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x)")
    reader = sqlite3.connect(path, check_same_thread=False)
    reader.execute("BEGIN")
    reader.execute("SELECT * FROM t").fetchall()  # a shared lock held
    release = threading.Timer(1.0, reader.rollback)
    release.start()
    try:
        open_storage(f"sqlite:///{path}")
    finally:
        release.join()
        reader.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
