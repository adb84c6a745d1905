"""What several processes searching one study (on a server database) need from each other:
who they are, distinct samplers, heartbeats that hand a dead worker's trial back to the queue,
and patience with a database that goes away for a moment."""
from __future__ import annotations

import os
import socket
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import optuna
from optuna.trial import FrozenTrial, TrialState

from knobtune.search.errors import RunError
from knobtune.search.storage import record
from knobtune.search.storage.database import redact
from knobtune.search.storage.record import TrialRecord

T = TypeVar("T")
RETRY_PAUSES_S = (1, 2, 4, 8, 15)  # then 15 s until the budget is spent


@dataclass(frozen=True)
class Sharing:
    """How this process shares its study: heartbeat period, the grace after which another
    worker's silent trial counts as dead, and how long to wait for a lost database."""
    heartbeat_s: int = 10
    grace_s: int = 60
    db_retry_s: float = 120.0


def worker_id() -> str:
    """``host:pid:nonce``, recorded on each trial this process runs (the nonce: containers on one
    host network all run as pid 1, cloned machines share a host name)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def host_of(worker: str) -> str:
    return worker.split(":", 1)[0]


class Heartbeats:
    """A thread that records a heartbeat for each trial this worker runs, every ``period_s``,
    whatever the main loop is busy with (a pause longer than the grace would get live trials
    taken for dead). A beat that fails (the database is away) is tried again next period."""

    def __init__(self, storage: Any, period_s: float) -> None:
        self.storage, self.period = storage, period_s
        self.trial_ids: set[int] = set()
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="knobtune-heartbeat", daemon=True)
        self.thread.start()

    def add(self, trial_id: int) -> None:
        """Beat for ``trial_id`` now (raises when the database is away) and from now on."""
        self.storage.record_heartbeat(trial_id)
        with self.lock:
            self.trial_ids.add(trial_id)

    def discard(self, trial_id: int) -> None:
        with self.lock:
            self.trial_ids.discard(trial_id)

    def _loop(self) -> None:
        while not self.stopped.wait(self.period):
            with self.lock:
                ids = sorted(self.trial_ids)
            for trial_id in ids:
                try:
                    self.storage.record_heartbeat(trial_id)
                except Exception:  # noqa: BLE001 - the database is away for a moment, or the trial ended
                    pass

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)


def sampler_seed(study_seed: int | None, worker: str) -> int:
    """The study's seed mixed with the worker's identity: two workers never draw the same
    sequence (with one seed, each would propose the same first configurations)."""
    return (zlib.crc32(worker.encode()) ^ ((study_seed or 0) * 2654435761)) % 2**32


def configuration(trial: FrozenTrial) -> dict[str, Any]:
    """What a trial was asked to measure: its queued params when it came from the queue (it may
    have died before they were suggested), else the params it had suggested."""
    return dict(trial.system_attrs.get("fixed_params") or trial.params)


def fail_and_requeue(study: optuna.Study, trial: FrozenTrial, failure: str, queue: Any) -> bool:
    """Fail the RUNNING ``trial`` with ``failure`` and queue its configuration again for a live
    worker (FAIL trials are not counted: the study still reaches its count, nothing counted twice).
    Under the study's queue lease (``queue``: a search.lease.Lease), and only when no earlier
    attempt queued it: a re-queue is never lost (queued before the FAIL) nor doubled. False when
    the trial had ended already (its owner finished it, or another worker got there first)."""
    storage = study._storage
    with queue.held():
        waiting_or_done = study.get_trials(deepcopy=False)
        if not any(TrialRecord.of(t).retry_of == trial.number for t in waiting_or_done):
            rec = TrialRecord.of(trial)
            study.enqueue_trial(configuration(trial), skip_if_exists=False, user_attrs=record.queued(
                is_baseline=rec.is_baseline, source=rec.source, warm_start_from=rec.warm_start_from,
                retry_of=trial.number))
        try:
            record.mark_stored(storage, trial._trial_id, failure=failure)  # (only a RUNNING trial takes it)
            return bool(storage.set_trial_state_values(trial._trial_id, TrialState.FAIL))
        except optuna.exceptions.UpdateFinishedTrialError:
            return False  # (a queued copy of a finished trial is skipped as a duplicate when asked)


class Silence:
    """Which other workers' trials went silent: a heartbeat older than the storage's grace, or
    no heartbeat at all (a process killed between asking for a trial and its first beat) for a
    grace period of this worker's own watching."""

    def __init__(self, grace_s: float) -> None:
        self.grace = grace_s
        self.first_seen: dict[int, float] = {}

    def fail(self, study: optuna.Study, mine: set[int], queue: Any) -> list[int]:
        """Fail and re-queue the silent trials (each by one live worker); the numbers this worker
        handled. (Optuna's fail_stale_trials fails them before its callback runs, when a trial no
        longer takes the attribute that says why: hence its stale-trial query here.)"""
        storage = study._storage
        handled = []
        for trial_id in storage._get_stale_trial_ids(study._study_id):
            if trial_id in mine:  # (its own beats lapsed: its measurement still stands)
                continue
            trial = storage.get_trial(trial_id)
            who = TrialRecord.of(trial).worker or "its worker"
            if fail_and_requeue(study, trial, f"interrupted: {who} stopped sending heartbeats; its configuration "
                                              f"was queued again", queue):
                handled.append(trial.number)
        now = time.monotonic()
        running = {t._trial_id: t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                   if t._trial_id not in mine}
        unbeaten = _without_heartbeat(storage, list(running))
        self.first_seen = {i: self.first_seen.get(i, now) for i in unbeaten}
        for trial_id, seen in self.first_seen.items():
            if now - seen > self.grace:
                trial = running[trial_id]
                if fail_and_requeue(study, trial, "interrupted: its worker never sent a heartbeat for it; its "
                                                  "configuration was queued again", queue):
                    handled.append(trial.number)
        return handled


def _without_heartbeat(storage: Any, trial_ids: list[int]) -> set[int]:
    """Those of ``trial_ids`` with no heartbeat row (Optuna's stale-trial query skips them)."""
    if not trial_ids:
        return set()
    import sqlalchemy as sa

    backend = getattr(storage, "_backend", storage)
    with backend.engine.connect() as conn:
        beating = {row[0] for row in conn.execute(
            sa.text("SELECT trial_id FROM trial_heartbeats WHERE trial_id IN :ids")
            .bindparams(sa.bindparam("ids", expanding=True)), {"ids": trial_ids})}
    return set(trial_ids) - beating


def is_connection_error(exc: BaseException) -> bool:
    """True for a lost or refused database connection (Optuna wraps SQLAlchemy's errors)."""
    from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (OperationalError, InterfaceError)):
            return True
        if isinstance(exc, DBAPIError) and exc.connection_invalidated:
            return True
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return False


class DatabaseLost(RunError):
    """The database stayed unreachable for the whole retry budget."""


def patiently(step: Callable[[], T], url: str, budget_s: float, say: Callable[[str], None],
              sleep: Callable[[float], None] = time.sleep) -> T:
    """``step()``, retried with backoff while the database is unreachable, for up to ``budget_s``
    seconds; then DatabaseLost, in one line with the password redacted."""
    started, attempt = time.monotonic(), 0
    while True:
        try:
            return step()
        except Exception as exc:  # noqa: BLE001 - only connection errors are retried
            if not is_connection_error(exc):
                raise
            waited = time.monotonic() - started
            reason = first_line(exc, url)
            if waited >= budget_s:
                raise DatabaseLost(f"lost the database {redact(url)} ({reason}); retried for {waited:.0f} s "
                                   f"(the limit: {budget_s:g} s, knobtune worker --db-retry); this worker's running "
                                   f"trials are left to the other workers' heartbeats") from None
            pause = min(RETRY_PAUSES_S[min(attempt, len(RETRY_PAUSES_S) - 1)], max(0.5, budget_s - waited))
            if attempt == 0:
                say(f"knobtune: the database {redact(url)} is unreachable ({reason}); retrying for up to "
                    f"{budget_s:g} s")
            attempt += 1
            sleep(pause)


def first_line(exc: BaseException, url: str) -> str:
    """The innermost error's first line, the URL's password redacted."""
    from knobtune.search.storage.database import scrub

    inner = exc
    while inner.__cause__ is not None:
        inner = inner.__cause__
    inner = getattr(inner, "orig", None) or inner
    lines = str(inner).strip().splitlines()
    return scrub(lines[0] if lines else type(inner).__name__, url)
