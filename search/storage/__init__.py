"""Where studies live, and what several processes sharing one need.

- ``database``: opening an Optuna storage from a URL (SQLite waits on locks; passwords redacted).
- ``runlock``: one live run per study on SQLite.
- ``workers``: several workers on one server database (heartbeats, re-queues, a lost database).
- ``lease``: work that exactly one of many workers does (asking for a trial, confirming).
- ``artifacts``: each trial's files (output, request, window chart) beside the storage.
"""
from __future__ import annotations

from knobtune.search.storage.database import DEFAULT_URL, is_sqlite, open_storage, redact, resolve_url
from knobtune.search.storage.lease import Lease
from knobtune.search.storage.workers import Sharing

__all__ = ["DEFAULT_URL", "Lease", "Sharing", "is_sqlite", "open_storage", "redact", "resolve_url"]
