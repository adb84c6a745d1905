"""The queue policy: what a study measures besides the sampler's proposals, and in which order.

The baseline goes first and alone (every trial is judged against it). Once it has succeeded, the
warm start's configurations (earlier studies' winners) and then the seeds' advice, applied by
hand, are queued; a proposal the study measured already is skipped for an unmeasured
configuration. The sampler proposes the rest.
"""
from __future__ import annotations

import random
from typing import Any, TextIO

import optuna
from optuna.trial import TrialState

from knobtune.search.errors import RunError
from knobtune.search.storage import record
from knobtune.search.storage.record import StudyRecord, TrialRecord
from knobtune.search.story import results
from knobtune.search.study import warmstart
from knobtune.search.study.objective import Plan, duplicate_of
from knobtune.search.study.survival import Alone

RANDOM_TRIES = 2000


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
    if StudyRecord.of(study).advice_enqueued or plan.definition.study.sampler == "random":
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


class Queue:
    """One run's view of the queue policy (``plan`` is the run's current plan: it narrows when the
    baseline shows knobs the script never exercises)."""

    def __init__(self, study: optuna.Study, plan: Plan, survival: Alone, rng: random.Random,
                 warm: list[warmstart.Candidate], err: TextIO) -> None:
        self.study, self.plan, self.survival, self.rng, self.warm, self.err = study, plan, survival, rng, warm, err

    def baseline_ok(self) -> bool:
        base = results.baseline(self.study)
        return base is not None and TrialRecord.of(base).ok

    def resume(self) -> None:
        """A run resumed with a new warm-start source queues it (its baseline succeeded before)."""
        if self.warm and self.survival.db(self.baseline_ok):
            self.survival.db(lambda: self.after_baseline(advice=False))

    def after_baseline(self, advice: bool) -> None:
        """The warm start's configurations, then (``advice``) the seeds' advice."""
        with self.survival.held():
            warmstart.enqueue(self.study, self.plan, self.warm, self.err)
            if advice:
                enqueue_advice(self.study, self.plan)

    def may_start(self, target: int, running: set[int], locked: bool = False) -> bool:
        """Room under the trial count, and the baseline measured (nothing runs beside it).
        ``locked``: under the queue's lease, where a shared study's missing baseline is queued."""
        if len(results.finished(self.study)) + len(running) >= target:
            return False
        if self.baseline_ok():
            return True
        if running:
            return False
        if self.survival.shared and locked:
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

    def skip_if_duplicate(self, trial: optuna.Trial, is_baseline: bool, running: set[int]) -> str | None:
        """None for a trial to measure. A proposal of knobs measured (or being measured) already
        is told FAIL, uncounted, and an unmeasured configuration is queued in its place:
        "skipped"; "wait" when only the running trials' results can tell what to explore next;
        "exhausted" when the space has no unmeasured configuration left."""
        running = running - {trial.number}
        # (a baseline queued again after it in fact succeeded is a duplicate too)
        twin = None if is_baseline and not self.baseline_ok() else duplicate_of(self.study, trial, running)
        if twin is None:
            return None
        # TPE converges on its favourite configuration; measuring it again teaches nothing.
        record.mark(trial, duplicate_of=twin, failure=f"skipped: same knobs as trial #{twin}")
        self.study.tell(trial, state=TrialState.FAIL)
        fresh = unmeasured(self.study, self.plan, self.rng, running)
        if fresh is None:
            if not running:
                self.err.write("knobtune: every configuration of the space has been measured; stopping\n")
                return "exhausted"
            return "wait"
        self.study.enqueue_trial(fresh, user_attrs=record.queued(source="explore"))
        return "skipped"
