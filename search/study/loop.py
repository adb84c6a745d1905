"""The trial loop: ask Optuna for trials, measure up to one per slot at once in isolated
children, tell the results; and the queue it feeds on (the baseline, the seeds' advice,
unmeasured configurations after a duplicate).

On a shared study (a server database, other workers on it: ``shared``) the trial count is
study-wide, asking is serialised between workers (a lease row: see search/storage/lease.py), running
trials get heartbeats from a thread, other workers' silent trials are failed and re-queued, and
a lost database is waited for (search/storage/workers.py)."""
from __future__ import annotations

import contextlib
import datetime
import random
import shutil
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, TextIO

import optuna
from optuna.trial import FrozenTrial, TrialState

from knobtune.search.errors import RunError
from knobtune.search.launch import partition
from knobtune.search.launch.partition import Partition
from knobtune.search.storage import artifacts, record, workers
from knobtune.search.storage.lease import Lease
from knobtune.search.storage.record import StudyRecord, TrialRecord
from knobtune.search.storage.workers import Sharing
from knobtune.search.story import findings, notes, results
from knobtune.search.story.progress import Progress
from knobtune.search.story.summary import trial_line
from knobtune.search.study import warmstart
from knobtune.search.study.objective import (
    Measurement,
    Plan,
    duplicate_of,
    measure,
    measure_baseline,
    prune_rule,
    suggest,
    tell,
    without_unexercised,
)

RANDOM_TRIES = 2000


def queue_lease(engine: Any, study_name: str, worker: str) -> Lease:
    """The lease under which workers of one study ask for trials and change its queue."""
    return Lease(engine, f"{study_name}/queue", worker, ttl_s=60)


def enqueue_baseline(study: optuna.Study, plan: Plan) -> None:
    """Queue the baseline unless an ok baseline exists or one is already waiting (or running: on
    a shared study, another worker's; a dead run's was failed before this).

    Nothing else is queued before a baseline has succeeded, so it is always the next trial.
    """
    base = results.baseline(study)
    queued = study.get_trials(deepcopy=False, states=[TrialState.WAITING, TrialState.RUNNING])
    if (base is None or not TrialRecord.of(base).ok) and not any(TrialRecord.of(t).is_baseline for t in queued):
        params = plan.space.baseline_params(plan.offer, plan.ctx, plan.definition.baseline)
        study.enqueue_trial(params, user_attrs=record.queued(is_baseline=True, source="baseline"))


def enqueue_advice(study: optuna.Study, plan: Plan) -> None:
    """Once per study, after its baseline succeeded: the seeds' advice applied by hand."""
    if StudyRecord.of(study).advice_enqueued or plan.definition.study.sampler != "tpe":
        return  # sampler = "random" is plain random search: no expert start
    baseline = plan.space.baseline_params(plan.offer, plan.ctx, plan.definition.baseline)
    advice = plan.space.advice_params(plan.offer, plan.ctx, plan.definition.baseline)
    if advice != baseline and advice not in results.configurations(study):  # (a warm start may have queued it)
        # (queued first: a lost connection between the two is retried whole)
        study.enqueue_trial(advice, user_attrs=record.queued(source="advice"))
    record.mark_study(study, advice_enqueued=True)


def unmeasured(study: optuna.Study, plan: Plan, rng: random.Random,
               running: set[int] = frozenset()) -> dict[str, Any] | None:  # type: ignore[assignment]
    """Params of a random configuration no trial has measured, is measuring (``running``) or
    waits to measure (None if none is found)."""
    seen = results.configurations(study, running)
    for _ in range(RANDOM_TRIES):
        params = plan.space.random_params(plan.offer, rng)
        if params not in seen:
            return params
    return None


def short_windows_note(number: int, short: dict[str, Any]) -> str:
    return (f"note: trial #{number}'s shortest window lasted {short['shortest_seconds'] * 1000:.0f} ms, under "
            f"[burst] min_window_seconds = {short['min_window_seconds']:g}: timing, queue transients and "
            f"allocator effects weigh on such windows; [burst] train_samples = {short['suggested_train_samples']} "
            f"would make them long enough (for a new study: --name)")


def unsettled_note(number: int, unsettled: dict[str, Any]) -> str:
    return (f"note: trial #{number}'s input pipeline held up to {unsettled['read_ahead_batches']} batches ahead, and "
            f"the burst had room to train through {unsettled['settled_batches']} before its windows: batches "
            f"loaded during warm-up may have inflated its rate (marked noisy); [burst] train_samples = "
            f"{unsettled['suggested_train_samples']} would leave room (for a new study: --name)")


BURST_NOTES = {"short_windows": short_windows_note, "unsettled": unsettled_note}


def best_label(study: optuna.Study) -> tuple[str, int] | None:
    """The progress bar's "best so far": samples/s, or seconds to target."""
    best = results.searched_best(study)
    if best is None:
        return None
    if results.mode(study) == "time-to-accuracy":
        return f"{best.value:.2f} s to target", best.number
    return f"{results.rate(best):,.0f} samples/s", best.number


def stop_searching_unexercised(plan: Plan, not_exercised: dict[str, str] | None, err: TextIO | None) -> Plan:
    """Stop searching the knobs the user's script never exercises (said once, on ``err``)."""
    narrowed = without_unexercised(plan, not_exercised)
    if err is not None and narrowed is not plan:
        for name in sorted(k for k, v in plan.offer.choices.items() if len(v) > len(narrowed.offer.choices[k])):
            err.write(f"knobtune: {name} is not searched: {not_exercised[name]}\n")  # type: ignore[index]
    return narrowed


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


def _ended_elsewhere(exc: BaseException) -> bool:
    """Telling failed because the trial had ended: another worker failed it for its silence."""
    return isinstance(exc, optuna.exceptions.UpdateFinishedTrialError) or (
        isinstance(exc, (RuntimeError, ValueError)) and "FAIL" in str(exc))


@dataclass
class Running:
    trial: optuna.Trial
    is_baseline: bool
    slots: list[Partition | None]  # one; every free one for a baseline measured several times
    kept: Path | None


class Search:
    """Measures up to one trial per slot at once (a slot is a partition of the machine, or the
    whole machine when there is one slot). Only this thread talks to the storage (and, on a
    shared study, the heartbeat thread); the slots' threads run the children."""

    def __init__(self, study: optuna.Study, plan: Plan, url: str, err: TextIO, progress: Progress,
                 artifact_store: Any, slots: list[Partition | None], rng: random.Random,
                 shared: Sharing | None = None, worker: str = "", engine: Any = None,
                 warm: list[warmstart.Candidate] | None = None) -> None:
        self.study, self.plan, self.url, self.err, self.progress = study, plan, url, err, progress
        self.warm = warm or []  # earlier studies' configurations, queued once the baseline succeeded
        self.artifact_store, self.rng, self.shared, self.worker = artifact_store, rng, shared, worker
        self.free = list(slots)
        self.running: dict[Future[Measurement], Running] = {}
        self.cancel = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=len(slots), thread_name_prefix="knobtune-slot")
        self.noted: set[str] = set()
        self.waiting = False       # every unmeasured configuration is running: ask again once one ends
        self.pending: optuna.Trial | None = None  # asked, not yet running or told (failed if the run stops)
        self.lost = False          # the database stayed away: stop without waiting for it again
        if shared is not None:
            self.queue = queue_lease(engine, study.study_name, worker)
            self.beats = workers.Heartbeats(study._storage, shared.heartbeat_s)
            self.silence = workers.Silence(shared.grace_s)
            self.checked_at = 0.0
            self.quiet_until = 0.0  # after an outage every worker's trials look silent for a while
            self.outage = False
            self.waited_on: tuple[int, frozenset[int], int] | None = None
            self.neighbour_said = False
            self.started = datetime.datetime.now()  # (Optuna's datetime_start: this machine's local time)
            self.cores = partition.machine_cores()  # this process's (a worker may be pinned to part of a machine)

    # -- the storage, patiently ------------------------------------------------------------------

    def _db(self, step: Callable[[], Any]) -> Any:
        if self.shared is None or self.lost:
            return step()

        def say(line: str) -> None:
            self.outage = True
            self.err.write(line + "\n")
        try:
            value = workers.patiently(step, self.url, self.shared.db_retry_s, say)
        except workers.DatabaseLost:
            self.lost = True
            raise
        if self.outage:  # back: give the other workers' heartbeats a grace period to resume too
            self.outage = False
            self.quiet_until = time.monotonic() + self.shared.grace_s
        return value

    def _queue_held(self) -> contextlib.AbstractContextManager[Any]:
        return self.queue.held() if self.shared is not None else contextlib.nullcontext()

    # -- what may run ----------------------------------------------------------------------------

    def _baseline_ok(self) -> bool:
        base = results.baseline(self.study)
        return base is not None and TrialRecord.of(base).ok

    def _running_numbers(self) -> set[int]:
        """The trials being measured: this run's; on a shared study, every worker's (a dead
        worker's trial is failed for its silence within the grace period)."""
        if self.shared is not None:
            return {t.number for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
        return {r.trial.number for r in self.running.values()}

    def _may_start(self, target: int, locked: bool = False) -> bool:
        """Room under the trial count, and the baseline measured (nothing runs beside it).
        ``locked``: under the queue's lease, where a missing baseline may be queued."""
        if len(results.finished(self.study)) + len(self._running_numbers()) >= target:
            return False
        if self._baseline_ok():
            return True
        if self._running_numbers():
            return False
        if self.shared is not None and locked:
            self._baseline_or_stop()
        return True

    def _baseline_or_stop(self) -> None:
        """Shared study, nothing running, no good baseline: make sure one is queued (a worker was
        stopped while measuring it), or stop when it was measured and failed."""
        queued = self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        if any(TrialRecord.of(t).is_baseline for t in queued):
            return
        base = results.baseline(self.study)
        if base is not None:
            raise RunError(f"the baseline trial #{base.number} did not succeed ({TrialRecord.of(base).outcome}); "
                           f"every other trial is judged against it, so this worker stops (a new run re-measures it)")
        enqueue_baseline(self.study, self.plan)

    # -- the loop --------------------------------------------------------------------------------

    def _queue_first(self, advice: bool) -> None:
        """After a successful baseline: the warm start's configurations, then (``advice``) the seeds' advice."""
        with self._queue_held():
            warmstart.enqueue(self.study, self.plan, self.warm, self.err)
            if advice:
                enqueue_advice(self.study, self.plan)

    def run(self, target: int, timeout: float | None) -> None:
        started, submitting = time.monotonic(), True
        if self.warm and self._db(self._baseline_ok):  # resumed with a new warm-start source
            self._db(lambda: self._queue_first(advice=False))
        try:
            while True:
                self._db(self._watch)
                if submitting and timeout is not None and time.monotonic() - started > timeout:
                    self.err.write(f"knobtune: --timeout {timeout:g} s reached; starting no new trial\n")
                    submitting = False
                while submitting and not self.waiting and self.free and self._db(lambda: self._may_start(target)):
                    step = self._db(lambda: self._start(target))
                    if step == "exhausted":
                        submitting = False
                    if step in ("exhausted", "wait", "held"):
                        self.waiting = step != "exhausted"
                        if self.waiting and self.shared is not None:
                            self.waited_on = self._db(self._state)
                        break
                if not self.running:
                    if (self.shared is None or not submitting
                            or self._db(lambda: len(results.finished(self.study))) >= target):
                        return
                    time.sleep(1.0)  # other workers' trials run: one may come back to the queue
                    self._db(self._maybe_ask_again)
                    continue
                done, _ = wait(self.running, timeout=0.25, return_when=FIRST_COMPLETED)
                self.progress.tick()
                for future in done:
                    self.waiting = False
                    self._finish(future)
        finally:
            self.pool.shutdown(wait=False)

    def _state(self) -> tuple[int, frozenset[int], int]:
        """What could change the next proposal: trials finished, running, waiting in the queue."""
        waiting = len(self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
        return len(results.finished(self.study)), frozenset(self._running_numbers()), waiting

    def _maybe_ask_again(self) -> None:
        """Shared study: after a "wait" (every configuration left is running on other workers),
        ask again only once a trial ended or one came back to the queue (else every idle worker
        would make a skipped duplicate a second)."""
        if self.waiting and self._state() != self.waited_on:
            self.waiting = False

    def _watch(self) -> None:
        """Shared study, every heartbeat period: other workers' silent trials are failed and
        re-queued; a worker on this machine's own cores is warned about."""
        if self.shared is None or time.monotonic() - self.checked_at < self.shared.heartbeat_s:
            return
        self.checked_at = time.monotonic()
        self._maybe_ask_again()
        if time.monotonic() >= self.quiet_until:
            mine = {r.trial._trial_id for r in self.running.values()}
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

    def _start(self, target: int) -> str:
        """Ask for a trial and start it on a free slot: "started"; or skip a duplicate: "skipped"
        ("wait" when only the running trials' results can tell what to explore next, "exhausted"
        when the space has no unmeasured configuration left, "held" when, on a shared study,
        another worker took the last room first)."""
        study, plan = self.study, self.plan
        if self.pending is not None:  # an earlier attempt lost the database after asking
            self._give_up(self.pending, "interrupted: the database connection dropped while it was being started",
                          quiet=False)
            self.pending = None
        with self._queue_held():
            if self.shared is not None and not self._may_start(target, locked=True):  # (again, under the lease)
                return "held"
            trial = self.pending = study.ask()
            if self.shared is not None:  # first: a trial never stays RUNNING without a heartbeat row
                self.beats.add(trial._trial_id)
                record.mark(trial, worker=self.worker, worker_cores=self.cores)
            # (under the lease: the next worker's sampler and duplicate check see these params)
            resolved = suggest(plan, trial)
        is_baseline = TrialRecord.of(trial).is_baseline
        # (a baseline queued again after it in fact succeeded is a duplicate too)
        twin = None if is_baseline and not self._baseline_ok() else duplicate_of(study, trial, self._running_numbers())
        if twin is not None:
            # TPE converges on its favourite configuration; measuring it again teaches nothing.
            # Skip it (uncounted) and explore an unmeasured configuration next.
            record.mark(trial, duplicate_of=twin, failure=f"skipped: same knobs as trial #{twin}")
            study.tell(trial, state=TrialState.FAIL)
            self._forget(trial)
            fresh = unmeasured(study, plan, self.rng, self._running_numbers())
            if fresh is None:
                if not self._running_numbers():
                    self.err.write("knobtune: every configuration of the space has been measured; stopping\n")
                    return "exhausted"
                return "wait"
            study.enqueue_trial(fresh, user_attrs=record.queued(source="explore"))
            return "skipped"
        marks: dict[str, Any] = {"role": findings.ROLE_BASELINE} if is_baseline else {"is_baseline": False}
        if TrialRecord.of(trial).source is None:
            marks["source"] = plan.definition.study.sampler
        slot = self.free[0]
        if slot is not None:
            marks["partition"] = slot.describe()
        record.mark(trial, **marks)
        watch = None if is_baseline else prune_rule(plan, study)
        # (the storage calls above may be retried: take the slots only now; a baseline, which runs
        # alone, measures its several runs side by side on every free share)
        slots = list(self.free) if is_baseline and slot is not None and not self.running else [slot]
        del self.free[:len(slots)]
        kept = Path(tempfile.mkdtemp(prefix="knobtune-artifacts-")) if self.artifact_store is not None else None
        slot_plan = replace(plan, placement=slot) if slot is not None else plan
        self.progress.started(trial.number)
        future = self.pool.submit(self._measure, slot_plan, resolved, is_baseline, watch, kept, slots)
        self.running[future] = Running(trial, is_baseline, slots, kept)
        self.pending = None
        return "started"

    def _forget(self, trial: optuna.Trial) -> None:
        """The trial has ended here: no more heartbeats for it."""
        if self.shared is not None:
            self.beats.discard(trial._trial_id)
        if self.pending is trial:
            self.pending = None

    def _measure(self, plan: Plan, resolved: dict[str, Any], is_baseline: bool,
                 watch: Callable[[list[dict[str, Any]]], str | None] | None, kept: Path | None,
                 slots: list[Partition | None]) -> Measurement:
        """In a slot's thread: the child (children, for the baseline's several seeds)."""
        if is_baseline:
            shares = [s for s in slots if s is not None]
            return measure_baseline(plan, resolved, keep=kept, cancel=self.cancel, placements=shares or None)
        return measure(plan, resolved, False, watch=watch, keep=kept, cancel=self.cancel)

    def _finish(self, future: Future[Measurement]) -> None:
        running = self.running.pop(future)
        self.free.extend(running.slots)
        try:
            measured = future.result()
        except BaseException as exc:  # the measurement never came back: the trial must not stay RUNNING
            if running.kept is not None:
                shutil.rmtree(running.kept, ignore_errors=True)
            fail_trial(self.study, running.trial, "interrupted by the user (Ctrl-C)" if isinstance(exc, KeyboardInterrupt)
                       else f"interrupted: the run failed while measuring it ({type(exc).__name__}: {exc})",
                       self.shared is not None)
            self._forget(running.trial)
            raise
        try:
            self._db(lambda: self._record(running, measured))
        finally:
            self._forget(running.trial)
            if running.kept is not None:
                shutil.rmtree(running.kept, ignore_errors=True)

    def _record(self, running: Running, measured: Measurement) -> None:
        """Store a measurement: artifacts, the trial's result, the notes; then what comes next.
        (On a shared study a lost database retries this whole step: a trial already told is not
        told again.)"""
        study, trial, is_baseline = self.study, running.trial, running.is_baseline
        state = study._storage.get_trial(trial._trial_id).state
        if state == TrialState.FAIL:  # silent for longer than the grace: other workers took it for dead
            self.err.write(f"knobtune: trial #{trial.number}'s result came back after the other workers had failed it "
                           f"for its silence and queued it again; this measurement is dropped\n")
            return
        if state == TrialState.RUNNING:
            try:
                if running.kept is not None:
                    artifacts.attach(study, trial, running.kept, measured.record.window_rates, self.artifact_store)
                self._tell(running, measured)
            except BaseException as exc:
                if self.shared is not None and workers.is_connection_error(exc):
                    raise  # (retried)
                if self.shared is not None and _ended_elsewhere(exc):
                    self.err.write(f"knobtune: trial #{trial.number} was failed by another worker while its result "
                                   f"was being stored; this measurement is dropped\n")
                    return
                fail_trial(study, trial, "interrupted while its result was being stored", self.shared is not None)
                raise
        finished = study.trials[trial.number]
        self.progress.best = best_label(study)
        base = results.baseline(study)
        base_knobs = results.knob_values(base) if base else None
        self.progress.finished(trial_line(finished.number, TrialRecord.of(finished), self.progress.best, base_knobs),
                               finished.number)
        notes.publish_safely(study, self.url, f"after trial #{finished.number}", self.err)
        for attr, note in BURST_NOTES.items():  # once per run: the burst is too short for this
            said = getattr(TrialRecord.of(finished), attr)
            if said and attr not in self.noted:
                self.noted.add(attr)
                self.err.write(note(finished.number, said) + "\n")
        if is_baseline and measured.outcome == "ok":
            self.plan = stop_searching_unexercised(self.plan, measured.record.not_exercised, self.err)
            self._queue_first(advice=True)
        if is_baseline and measured.outcome != "ok":
            raise RunError(
                f"the baseline trial #{finished.number} did not succeed ({measured.outcome}: "
                f"{(measured.record.failure or '').splitlines()[0] if measured.record.failure else ''}); "
                f"every other trial is judged against it, so the study stops here"
            )

    def _tell(self, running: Running, measured: Measurement) -> None:
        study, trial, is_baseline = self.study, running.trial, running.is_baseline
        base = results.baseline(study)
        base_ok = base is not None and TrialRecord.of(base).ok
        base_acc = TrialRecord.of(base).measured_accuracies if base_ok and not is_baseline else None
        if not is_baseline and not base_ok:
            raise RunError("no successful baseline trial to compare with; run again to re-measure it")
        if measured.outcome == "pruned":
            full = [TrialRecord.of(t).trial_seconds or 0.0 for t in results.feasible(study)]
            if full:
                measured = measured.but(time_saved_seconds=round(max(0.0, sum(full) / len(full)
                                                                     - (measured.record.trial_seconds or 0.0)), 2))
        tell(study, trial, measured, self.plan.definition, base_acc)

    # -- stopping --------------------------------------------------------------------------------

    def stop(self, reason: str) -> None:
        """Kill the running children (each slot's thread sees the cancel within a poll), wait for
        them, and mark their trials failed with ``reason``: a resumed run measures them again (on a
        shared study their configurations go back to the queue for the other workers)."""
        self.cancel.set()
        try:
            if self.pending is not None:  # asked, never started
                self._give_up_safely(self.pending, reason)
                self.pending = None
            for future, running in list(self.running.items()):
                try:
                    future.result(timeout=60)
                    finished = True  # it came back before the cancel reached it: keep the measurement
                except BaseException:  # Cancelled, as a rule
                    finished = False
                if finished:
                    try:
                        self._finish(future)
                        continue
                    except BaseException:
                        pass  # _finish failed the trial
                else:
                    self._give_up_safely(running.trial, reason)
                if running.kept is not None:
                    shutil.rmtree(running.kept, ignore_errors=True)
            self.running.clear()
            self.pool.shutdown(wait=True)
        finally:
            self.close()

    def _give_up_safely(self, trial: optuna.Trial, reason: str) -> None:
        """``_give_up`` while stopping: whatever goes wrong is said in a line, and the stop goes on."""
        try:
            self._give_up(trial, reason)
        except Exception as exc:  # noqa: BLE001 - the run is stopping on another error already
            self.err.write(f"knobtune: trial #{trial.number} could not be marked failed ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0] if str(exc) else ''}); the next run or another worker will\n")

    def close(self) -> None:
        if self.shared is not None:
            self.beats.stop()

    def _give_up(self, trial: optuna.Trial, reason: str, quiet: bool = True) -> None:
        """Fail a trial this worker will not finish; on a shared study its configuration goes back
        to the queue for the other workers. ``quiet``: a lost database is left to the heartbeats
        (else it is raised, to be retried)."""
        if self.shared is None:
            fail_trial(self.study, trial, reason)
            return
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
