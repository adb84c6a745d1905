"""Surviving the other workers of a shared study, and a lost database; nothing at all when a run is
alone on its study (SQLite, or a server database with no ``knobtune worker`` beside it).

The trial loop (``loop.Search``) talks to one of two collaborators with the same methods:

- ``Alone``: every step runs once, nothing is leased, the running trials are the loop's own, a
  trial given up is failed.
- ``Together``: on a server database with other workers (``Sharing``): storage steps are retried
  while the database is away (``workers.patiently``), asking for a trial and changing the queue
  happen under the study's queue lease, this worker's trials send heartbeats, other workers'
  silent trials are failed and re-queued, a worker on this machine's own cores is warned about,
  and a trial given up goes back to the queue for the others.
"""
from __future__ import annotations

import contextlib
import datetime
import time
from typing import Any, Callable, TextIO, TypeVar

import optuna
from optuna.trial import FrozenTrial, TrialState

from knobtune.search.launch import partition
from knobtune.search.storage import record, workers
from knobtune.search.storage.lease import Lease
from knobtune.search.storage.record import TrialRecord
from knobtune.search.storage.workers import Sharing
from knobtune.search.story import results

T = TypeVar("T")


def queue_lease(engine: Any, study_name: str, worker: str) -> Lease:
    """The lease under which workers of one study ask for trials and change its queue."""
    return Lease(engine, f"{study_name}/queue", worker, ttl_s=60)


def fail_trial(study: optuna.Study, trial: optuna.Trial, reason: str, shared: bool = False) -> None:
    """Tell ``trial`` FAIL with ``reason`` (nothing when it was told already; nor, on a ``shared``
    study, when the database is away: then its heartbeat stops and another worker fails it)."""
    try:
        record.mark(trial, failure=reason)
        study.tell(trial, state=TrialState.FAIL)
    except (RuntimeError, ValueError, optuna.exceptions.UpdateFinishedTrialError):  # already told
        pass
    except Exception as exc:  # noqa: BLE001
        if not (shared and workers.is_connection_error(exc)):
            raise


def ended_elsewhere(exc: BaseException) -> bool:
    """Telling failed because the trial had ended: another worker failed it for its silence."""
    return isinstance(exc, optuna.exceptions.UpdateFinishedTrialError) or (
        isinstance(exc, (RuntimeError, ValueError)) and "FAIL" in str(exc))


class Alone:
    """A run alone on its study: the loop's calls go straight through."""

    shared = False
    lost = False  # the database stayed away: stop without waiting for it again

    def __init__(self, study: optuna.Study) -> None:
        self.study = study

    def db(self, step: Callable[[], T]) -> T:
        """A storage step (retried while the database is away, on a shared study)."""
        return step()

    def held(self) -> contextlib.AbstractContextManager[Any]:
        """The queue's lease, for asking and changing the queue."""
        return contextlib.nullcontext()

    def running(self, mine: set[int]) -> set[int]:
        """The trials being measured: ``mine``, the loop's own."""
        return mine

    def asked(self, trial: optuna.Trial) -> None:
        """A trial was just asked for (before anything else is stored about it)."""

    def ended(self, trial: optuna.Trial) -> None:
        """This run is done with ``trial``."""

    def check(self, mine: set[int], waiting: bool) -> bool:
        """Every turn of the loop (``mine``: the ids of the trials this run measures; ``waiting``:
        every unmeasured configuration is running). Whether a proposal could differ now, other
        than by one of this run's trials ending."""
        return False

    def waited(self) -> None:
        """Every unmeasured configuration is running: remember what could change that."""

    def may_ask_again(self) -> bool:
        """After a wait, with nothing of this run's running: whether a proposal could differ now."""
        return False

    def others_may_finish(self, target: int) -> bool:
        """Nothing of this run is running and it may still start trials: whether to wait for other
        workers' trials (one may come back to the queue) rather than end."""
        return False

    def failed_measuring(self, trial: optuna.Trial, reason: str) -> None:
        """The measurement never came back: the trial must not stay RUNNING."""
        fail_trial(self.study, trial, reason)

    def storing_failed(self, exc: BaseException, trial: optuna.Trial, err: TextIO) -> bool:
        """Storing ``trial``'s result raised ``exc``: True when the measurement is dropped quietly
        (another worker ended the trial); raises to have the step retried (a lost database)."""
        return False

    def give_up(self, trial: optuna.Trial, reason: str, quiet: bool = True) -> None:
        """Fail a trial this run will not finish."""
        fail_trial(self.study, trial, reason)

    def close(self) -> None:
        pass


class Together(Alone):
    """A worker among others on one study (a server database)."""

    shared = True

    def __init__(self, study: optuna.Study, sharing: Sharing, url: str, worker: str, engine: Any,
                 err: TextIO) -> None:
        super().__init__(study)
        self.sharing, self.url, self.worker, self.err = sharing, url, worker, err
        self.queue = queue_lease(engine, study.study_name, worker)
        self.beats = workers.Heartbeats(study._storage, sharing.heartbeat_s)
        self.silence = workers.Silence(sharing.grace_s)
        self.checked_at = 0.0
        self.quiet_until = 0.0  # after an outage every worker's trials look silent for a while
        self.outage = False
        self.waited_on: tuple[int, frozenset[int], int] | None = None
        self.neighbour_said = False
        self.started = datetime.datetime.now()  # (Optuna's datetime_start: this machine's local time)
        self.cores = partition.machine_cores()  # this process's (a worker may be pinned to part of a machine)

    def db(self, step: Callable[[], T]) -> T:
        if self.lost:
            return step()

        def say(line: str) -> None:
            self.outage = True
            self.err.write(line + "\n")
        try:
            value = workers.patiently(step, self.url, self.sharing.db_retry_s, say)
        except workers.DatabaseLost:
            self.lost = True
            raise
        if self.outage:  # back: give the other workers' heartbeats a grace period to resume too
            self.outage = False
            self.quiet_until = time.monotonic() + self.sharing.grace_s
        return value

    def held(self) -> contextlib.AbstractContextManager[Any]:
        return self.queue.held()

    def running(self, mine: set[int]) -> set[int]:
        """Every worker's running trials (a dead worker's is failed for its silence within the grace)."""
        return {t.number for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}

    def asked(self, trial: optuna.Trial) -> None:
        self.beats.add(trial._trial_id)  # first: a trial never stays RUNNING without a heartbeat row
        record.mark(trial, worker=self.worker, worker_cores=self.cores)

    def ended(self, trial: optuna.Trial) -> None:
        self.beats.discard(trial._trial_id)

    def _state(self) -> tuple[int, frozenset[int], int]:
        """What could change the next proposal: trials finished, running, waiting in the queue."""
        waiting = len(self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
        return len(results.finished(self.study)), frozenset(self.running(set())), waiting

    def waited(self) -> None:
        self.waited_on = self.db(self._state)

    def may_ask_again(self) -> bool:
        """Ask again only once a trial ended or one came back to the queue (else every idle worker
        would make a skipped duplicate a second)."""
        return self._state() != self.waited_on

    def others_may_finish(self, target: int) -> bool:
        if self.db(lambda: len(results.finished(self.study))) >= target:
            return False
        time.sleep(1.0)  # other workers' trials run: one may come back to the queue
        return True

    def check(self, mine: set[int], waiting: bool) -> bool:
        """Every heartbeat period: whether the study changed since a wait; other workers' silent
        trials are failed and re-queued; a worker on this machine's own cores is warned about."""
        if time.monotonic() - self.checked_at < self.sharing.heartbeat_s:
            return False
        self.checked_at = time.monotonic()
        changed = waiting and self.may_ask_again()
        if time.monotonic() >= self.quiet_until:
            for number in self.silence.fail(self.study, mine, self.queue):
                self.err.write(f"knobtune: trial #{number}'s worker went silent; its configuration is queued again\n")
        if not self.neighbour_said:
            host, cores = workers.host_of(self.worker), set(self.cores)
            # (trials started since this worker did: a dead worker's leftover trial is not a neighbour)
            near = sorted({w for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                           if isinstance(w := (r := TrialRecord.of(t)).worker, str) and w != self.worker
                           and t.datetime_start is not None and t.datetime_start > self.started
                           and workers.host_of(w) == host and cores & set(r.worker_cores or cores)})
            if near:
                self.neighbour_said = True
                self.err.write(f"warning: another worker of this study runs on this machine's cores "
                               f"({', '.join(near)}): their trials measure at once and distort each other; run one "
                               f"worker per machine (--jobs N splits a machine between trials)\n")
        return changed

    def failed_measuring(self, trial: optuna.Trial, reason: str) -> None:
        fail_trial(self.study, trial, reason, shared=True)

    def storing_failed(self, exc: BaseException, trial: optuna.Trial, err: TextIO) -> bool:
        if workers.is_connection_error(exc):
            raise exc  # (retried)
        if ended_elsewhere(exc):
            err.write(f"knobtune: trial #{trial.number} was failed by another worker while its result "
                      f"was being stored; this measurement is dropped\n")
            return True
        return False

    def give_up(self, trial: optuna.Trial, reason: str, quiet: bool = True) -> None:
        """Its configuration goes back to the queue for the other workers. ``quiet``: a lost
        database is left to the heartbeats (else it is raised, to be retried)."""
        try:
            frozen: FrozenTrial = self.study._storage.get_trial(trial._trial_id)
            if frozen.state == TrialState.RUNNING:
                workers.fail_and_requeue(self.study, frozen, f"{reason}; its configuration was queued again for the "
                                                             f"other workers", self.queue)
        except Exception as exc:  # noqa: BLE001
            if not workers.is_connection_error(exc) or not quiet:
                raise
        finally:
            self.beats.discard(trial._trial_id)

    def close(self) -> None:
        self.beats.stop()
