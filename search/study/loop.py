"""The trial loop, shaped like Optuna's ``_optimize``/``_tell``: ask for a trial, measure it in an
isolated child on a free slot, tell the result; up to one trial per slot at once.

Two collaborators keep the loop short: the queue policy (``queue.Queue``: the baseline first and
alone, the warm start and the seeds' advice after it, an unmeasured configuration in place of a
duplicate proposal) and the survival among other workers (``survival.Alone`` does nothing;
``survival.Together``, on a shared study: retries while the database is away, the queue's lease,
heartbeats, silent trials re-queued)."""
from __future__ import annotations

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
from optuna.trial import TrialState

from knobtune.search.errors import RunError
from knobtune.search.launch.partition import Partition
from knobtune.search.storage import artifacts, record
from knobtune.search.storage.record import TrialRecord
from knobtune.search.storage.workers import Sharing
from knobtune.search.story import findings, notes, results
from knobtune.search.story.progress import Progress
from knobtune.search.story.summary import BURST_NOTES, best_label, trial_line
from knobtune.search.study import warmstart
from knobtune.search.study.objective import (
    Measurement,
    Plan,
    measure,
    measure_baseline,
    prune_rule,
    suggest,
    tell,
    without_unexercised,
)
from knobtune.search.study.queue import Queue
from knobtune.search.study.survival import Alone, Together


def stop_searching_unexercised(plan: Plan, not_exercised: dict[str, str] | None, err: TextIO | None) -> Plan:
    """Stop searching the knobs the user's script never exercises (said once, on ``err``)."""
    narrowed = without_unexercised(plan, not_exercised)
    if err is not None and narrowed is not plan:
        for name in sorted(k for k, v in plan.offer.choices.items() if len(v) > len(narrowed.offer.choices[k])):
            err.write(f"knobtune: {name} is not searched: {not_exercised[name]}\n")  # type: ignore[index]
    return narrowed


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
        self.study, self.url, self.err, self.progress = study, url, err, progress
        self.artifact_store = artifact_store
        self.survival = Together(study, shared, url, worker, engine, err) if shared is not None else Alone(study)
        self.queue = Queue(study, plan, self.survival, rng, warm or [], err)
        self.free = list(slots)
        self.running: dict[Future[Measurement], Running] = {}
        self.cancel = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=len(slots), thread_name_prefix="knobtune-slot")
        self.noted: set[str] = set()
        self.waiting = False       # every unmeasured configuration is running: ask again once one ends
        self.pending: optuna.Trial | None = None  # asked, not yet running or told (failed if the run stops)

    @property
    def plan(self) -> Plan:
        return self.queue.plan

    def _running(self) -> set[int]:
        """The trials being measured: this run's, or on a shared study every worker's."""
        return self.survival.running({r.trial.number for r in self.running.values()})

    # -- the loop --------------------------------------------------------------------------------

    def run(self, target: int, timeout: float | None) -> None:
        """Until ``target`` trials have finished: ask and start while a slot is free, wait for
        one to end, tell it. ``timeout``: after that many seconds, start no new trial."""
        started, asking = time.monotonic(), True
        self.queue.resume()
        try:
            while True:
                mine = {r.trial._trial_id for r in self.running.values()}
                if self.survival.db(lambda: self.survival.check(mine, self.waiting)):
                    self.waiting = False
                if asking and timeout is not None and time.monotonic() - started > timeout:
                    self.err.write(f"knobtune: --timeout {timeout:g} s reached; starting no new trial\n")
                    asking = False
                if asking:
                    asking = self._ask_while_room(target)
                if not self.running:
                    if not asking or not self.survival.others_may_finish(target):
                        return
                    if self.waiting and self.survival.db(self.survival.may_ask_again):
                        self.waiting = False
                    continue
                done, _ = wait(self.running, timeout=0.25, return_when=FIRST_COMPLETED)
                self.progress.tick()
                for future in done:
                    self.waiting = False
                    self._tell(future)
        finally:
            self.pool.shutdown(wait=False)

    def _ask_while_room(self, target: int) -> bool:
        """Start trials on the free slots while the queue allows; False once the space is exhausted."""
        db = self.survival.db
        while not self.waiting and self.free and db(lambda: self.queue.may_start(target, self._running())):
            step = db(lambda: self._ask(target))
            if step == "exhausted":
                return False
            if step in ("wait", "held"):
                self.waiting = True
                self.survival.waited()
                break
        return True

    def _ask(self, target: int) -> str:
        """Ask for a trial and start it on a free slot: "started"; or the queue's "skipped",
        "wait" or "exhausted" for a duplicate proposal; "held" when, on a shared study, another
        worker took the last room first."""
        study = self.study
        if self.pending is not None:  # an earlier attempt lost the database after asking
            self.survival.give_up(self.pending, "interrupted: the database connection dropped while it was being "
                                                "started", quiet=False)
            self.pending = None
        with self.survival.held():
            if self.survival.shared and not self.queue.may_start(target, self._running(), locked=True):
                return "held"  # (again, under the lease)
            trial = self.pending = study.ask()
            self.survival.asked(trial)
            # (under the lease: the next worker's sampler and duplicate check see these params)
            resolved = suggest(self.plan, trial)
        is_baseline = bool(TrialRecord.of(trial).is_baseline)
        skipped = self.queue.skip_if_duplicate(trial, is_baseline, self._running())
        if skipped is not None:
            self._forget(trial)
            return skipped
        self._start(trial, resolved, is_baseline)
        return "started"

    def _start(self, trial: optuna.Trial, resolved: dict[str, Any], is_baseline: bool) -> None:
        """Mark the trial and measure it on a slot's thread (a baseline, which runs alone, measures
        its several runs side by side on every free share)."""
        marks: dict[str, Any] = {"role": findings.ROLE_BASELINE} if is_baseline else {"is_baseline": False}
        if TrialRecord.of(trial).source is None:
            marks["source"] = self.plan.definition.study.sampler
        slot = self.free[0]
        if slot is not None:
            marks["partition"] = slot.describe()
        record.mark(trial, **marks)
        watch = None if is_baseline else prune_rule(self.plan, self.study)
        # (the storage calls above may be retried: take the slots only now)
        slots = list(self.free) if is_baseline and slot is not None and not self.running else [slot]
        del self.free[:len(slots)]
        kept = Path(tempfile.mkdtemp(prefix="knobtune-artifacts-")) if self.artifact_store is not None else None
        plan = replace(self.plan, placement=slot) if slot is not None else self.plan
        self.progress.started(trial.number)
        future = self.pool.submit(self._measure, plan, resolved, is_baseline, watch, kept, slots)
        self.running[future] = Running(trial, is_baseline, slots, kept)
        self.pending = None

    def _measure(self, plan: Plan, resolved: dict[str, Any], is_baseline: bool,
                 watch: Callable[[list[dict[str, Any]]], str | None] | None, kept: Path | None,
                 slots: list[Partition | None]) -> Measurement:
        """In a slot's thread: the child (children, for the baseline's several seeds)."""
        if is_baseline:
            shares = [s for s in slots if s is not None]
            return measure_baseline(plan, resolved, keep=kept, cancel=self.cancel, placements=shares or None)
        return measure(plan, resolved, False, watch=watch, keep=kept, cancel=self.cancel)

    def _forget(self, trial: optuna.Trial) -> None:
        """The trial has ended here."""
        self.survival.ended(trial)
        if self.pending is trial:
            self.pending = None

    # -- telling ---------------------------------------------------------------------------------

    def _tell(self, future: Future[Measurement]) -> None:
        """A measurement came back: store it (and free its slot); or fail the trial when the
        measurement never came back."""
        running = self.running.pop(future)
        self.free.extend(running.slots)
        try:
            measured = future.result()
        except BaseException as exc:  # the trial must not stay RUNNING
            if running.kept is not None:
                shutil.rmtree(running.kept, ignore_errors=True)
            self.survival.failed_measuring(
                running.trial, "interrupted by the user (Ctrl-C)" if isinstance(exc, KeyboardInterrupt)
                else f"interrupted: the run failed while measuring it ({type(exc).__name__}: {exc})")
            self._forget(running.trial)
            raise
        try:
            self.survival.db(lambda: self._store(running, measured))
        finally:
            self._forget(running.trial)
            if running.kept is not None:
                shutil.rmtree(running.kept, ignore_errors=True)

    def _store(self, running: Running, measured: Measurement) -> None:
        """Artifacts, the trial's record and verdict, its line and the notes; then what the
        baseline's result means for the rest. (On a shared study a lost database retries this
        whole step: a trial already told is not told again.)"""
        study, trial = self.study, running.trial
        state = study._storage.get_trial(trial._trial_id).state
        if state == TrialState.FAIL:  # silent for longer than the grace: other workers took it for dead
            self.err.write(f"knobtune: trial #{trial.number}'s result came back after the other workers had failed it "
                           f"for its silence and queued it again; this measurement is dropped\n")
            return
        if state == TrialState.RUNNING:
            try:
                if running.kept is not None:
                    artifacts.attach(study, trial, running.kept, measured.record.window_rates, self.artifact_store)
                self._verdict(running, measured)
            except BaseException as exc:
                if self.survival.storing_failed(exc, trial, self.err):
                    return
                self.survival.failed_measuring(trial, "interrupted while its result was being stored")
                raise
        self._say(study.trials[trial.number])
        if running.is_baseline:
            self._after_baseline(measured, trial.number)

    def _verdict(self, running: Running, measured: Measurement) -> None:
        """Tell Optuna the trial's values and state, judged against the baseline."""
        study, is_baseline = self.study, running.is_baseline
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
        tell(study, running.trial, measured, self.plan.definition, base_acc)

    def _say(self, finished: optuna.trial.FrozenTrial) -> None:
        """The trial's line, the notes, and once per run what the burst is too short for."""
        study = self.study
        self.progress.best = best_label(study)
        base = results.baseline(study)
        rec = TrialRecord.of(finished)
        self.progress.finished(trial_line(finished.number, rec, self.progress.best,
                                          results.knob_values(base) if base else None), finished.number)
        notes.publish_safely(study, self.url, f"after trial #{finished.number}", self.err)
        for attr, note in BURST_NOTES.items():
            said = getattr(rec, attr)
            if said and attr not in self.noted:
                self.noted.add(attr)
                self.err.write(note(finished.number, said) + "\n")

    def _after_baseline(self, measured: Measurement, number: int) -> None:
        """A good baseline narrows the search to the knobs the script exercises and opens the
        queue; a failed one stops the study."""
        if measured.outcome == "ok":
            self.queue.plan = stop_searching_unexercised(self.plan, measured.record.not_exercised, self.err)
            self.queue.after_baseline(advice=True)
            return
        failure = measured.record.failure
        raise RunError(
            f"the baseline trial #{number} did not succeed ({measured.outcome}: "
            f"{failure.splitlines()[0] if failure else ''}); every other trial is judged against it, so the "
            f"study stops here"
        )

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
                        self._tell(future)
                        continue
                    except BaseException:
                        pass  # _tell failed the trial
                else:
                    self._give_up_safely(running.trial, reason)
                if running.kept is not None:
                    shutil.rmtree(running.kept, ignore_errors=True)
            self.running.clear()
            self.pool.shutdown(wait=True)
        finally:
            self.close()

    def _give_up_safely(self, trial: optuna.Trial, reason: str) -> None:
        """Give ``trial`` up while stopping: whatever goes wrong is said in a line, and the stop goes on."""
        try:
            self.survival.give_up(trial, reason)
        except Exception as exc:  # noqa: BLE001 - the run is stopping on another error already
            self.err.write(f"knobtune: trial #{trial.number} could not be marked failed ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0] if str(exc) else ''}); the next run or another worker will\n")

    def close(self) -> None:
        self.survival.close()
