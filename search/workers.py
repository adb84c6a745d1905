"""What several processes searching one study (on a server database) need from each other:
who they are, distinct samplers, heartbeats that hand a dead worker's trial back to the queue,
and patience with a database that goes away for a moment."""
from __future__ import annotations

import os
import socket
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import optuna
from optuna.trial import FrozenTrial, TrialState

from search.errors import RunError
from search.storage import redact

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
    """``host:pid``, recorded on each trial this process runs."""
    return f"{socket.gethostname()}:{os.getpid()}"


def sampler_seed(study_seed: int | None, worker: str) -> int:
    """The study's seed mixed with the worker's identity: two workers never draw the same
    sequence (with one seed, each would propose the same first configurations)."""
    return (zlib.crc32(worker.encode()) ^ ((study_seed or 0) * 2654435761)) % 2**32


def fail_and_requeue(study: optuna.Study, trial: FrozenTrial, failure: str) -> bool:
    """Fail the RUNNING ``trial`` with ``failure`` and queue its configuration again for a live
    worker (FAIL trials are not counted: the study still reaches its count, nothing counted twice).
    False when it had ended already: another worker got there first (the state change is atomic)."""
    storage = study._storage
    try:
        storage.set_trial_user_attr(trial._trial_id, "failure", failure)  # (only a RUNNING trial takes it)
        if not storage.set_trial_state_values(trial._trial_id, TrialState.FAIL):
            return False
    except optuna.exceptions.UpdateFinishedTrialError:
        return False
    keep = {k: trial.user_attrs[k] for k in ("is_baseline", "source") if k in trial.user_attrs}
    study.enqueue_trial(trial.params, user_attrs={**keep, "retry_of": trial.number}, skip_if_exists=False)
    return True


def fail_silent(study: optuna.Study) -> list[int]:
    """Trials whose heartbeat is older than the storage's grace period (their worker was killed or
    its machine vanished): failed and re-queued, each by one live worker. The numbers of those
    this worker handled. (Optuna's fail_stale_trials fails them before its callback runs, when a
    trial no longer takes the attribute that says why: hence its stale-trial query here.)"""
    storage = study._storage
    handled = []
    for trial_id in storage._get_stale_trial_ids(study._study_id):
        trial = storage.get_trial(trial_id)
        who = trial.user_attrs.get("worker", "its worker")
        if fail_and_requeue(study, trial, f"interrupted: {who} stopped sending heartbeats; its configuration "
                                          f"was queued again"):
            handled.append(trial.number)
    return handled


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
            reason = _first_line(exc, url)
            if waited >= budget_s:
                raise DatabaseLost(f"lost the database {redact(url)} ({reason}); retried for {waited:.0f} s "
                                   f"(--db-retry {budget_s:g}); this worker's running trials are left to the "
                                   f"other workers' heartbeats") from None
            pause = min(RETRY_PAUSES_S[min(attempt, len(RETRY_PAUSES_S) - 1)], max(0.5, budget_s - waited))
            if attempt == 0:
                say(f"knobtune: the database {redact(url)} is unreachable ({reason}); retrying for up to "
                    f"{budget_s:g} s")
            attempt += 1
            sleep(pause)


def _first_line(exc: BaseException, url: str) -> str:
    from search.storage import scrub

    inner = exc
    while inner.__cause__ is not None:
        inner = inner.__cause__
    inner = getattr(inner, "orig", None) or inner
    lines = str(inner).strip().splitlines()
    return scrub(lines[0] if lines else type(inner).__name__, url)
