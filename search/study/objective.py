"""One trial, engine side: knobs from the space, a burst in a child, attributes and the verdict
told to Optuna in the study's objective mode. Non-ok outcomes never get a made-up objective
value: they are told as PRUNED with an infeasible constraint, which TPE learns from (FAIL trials
it would ignore); a trial pruned for being slow is PRUNED with its window rates as intermediate
values."""
from __future__ import annotations

import statistics
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable

import optuna
from optuna.trial import TrialState

from knobtune.search.launch.partition import Partition
from knobtune.search.launch.runner import ChildResult, run_child
from knobtune.search.storage import record
from knobtune.search.storage.record import KnobEntry, TrialRecord
from knobtune.search.story import results
from knobtune.search.study.definition import Definition
from knobtune.spaces.knobs import Context, Offer, Resolved, Space
from knobtune.trainers.common.errors import InvalidKnobs
from knobtune.trainers.common.protocol import make_schedule
from knobtune.trainers.common.wire import Burst, Measured, Request


@dataclass(frozen=True)
class Plan:
    """What every trial of a study shares."""

    definition: Definition
    space: Space
    offer: Offer
    ctx: Context
    workdir: str
    placement: Partition | None = None  # the partition every child of this plan runs on (None: the whole machine)
    nproc: int = 1  # ranks per trial ([study] nproc, "auto" resolved on this machine)

    def lr_scale(self, knobs: dict[str, Any]) -> float:
        """The learning-rate factor [study] lr_scaling asks for, from the effective batch ratio."""
        how = self.definition.study.lr_scaling
        if how == "none":
            return 1.0
        base = self.space.defaults(self.ctx, self.definition.baseline)
        base_accumulation = self.offer.derived("accumulation_steps", base) or base["accumulation_steps"]
        ratio = (knobs["batch_size"] * knobs["accumulation_steps"]) / (base["batch_size"] * base_accumulation)
        return ratio if how == "linear" else ratio ** 0.5

    def request(self, knobs: dict[str, Any], seed_offset: int = 0) -> Request:
        """The child's burst request; ``seed_offset`` re-seeds it (the baseline's extra runs)."""
        d = self.definition
        burst = d.burst
        return Request(
            workload=d.study.workload,
            workload_options=d.workload,
            script=d.study.script,
            args=d.study.args,
            knobs=knobs,
            burst=Burst(train_samples=burst.train_samples, warmup_samples=burst.warmup_samples,
                        windows=d.burst_windows(), min_window_seconds=burst.min_window_seconds),
            seed=(d.study.seed or 0) + seed_offset,
            workdir=self.workdir,
            lr_scale=self.lr_scale(knobs),
            # counted once per study by the probe, so no trial reads every file again
            train_records=self.ctx.get("workload", {}).get("train_samples"),
            accuracy_required=d.guard.accuracy,
            target_accuracy=d.study.target_accuracy if d.study.objective == "time-to-accuracy" else None,
            nproc=self.nproc,
        )


@dataclass(frozen=True)
class Measurement:
    """What one trial measured: the record it is stored with."""

    record: TrialRecord

    @property
    def outcome(self) -> str:
        return self.record.outcome or "crash"

    @property
    def samples_per_second(self) -> float | None:
        return self.record.samples_per_second

    @property
    def val_accuracy(self) -> float | None:
        return self.record.val_accuracy

    def but(self, **changes: Any) -> Measurement:
        return Measurement(self.record.but(**changes))


def knob_attrs(resolved: dict[str, Resolved], effective: dict[str, Any],
               not_exercised: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Each knob's effective value: what the child read back for applied knobs, else the default;
    a knob the user's script never exercised is not applied, with the reason."""
    out: dict[str, dict[str, Any]] = {}
    for name, entry in resolved.items():
        attr = entry.as_attr()
        if entry.applied and name in (not_exercised or {}):
            out[name] = {"value": entry.value, "applied": False, "why": not_exercised[name]}  # type: ignore[index]
            continue
        if entry.applied and name in effective:
            attr["value"] = effective[name]
            if effective[name] != entry.value:
                attr["why"] = f"requested {entry.value!r}, the framework used {effective[name]!r}"
        out[name] = attr
    return out


def measurement_from_child(child: ChildResult, resolved: dict[str, Resolved], is_baseline: bool) -> Measurement:
    """The trial's record of what its child measured (the child's ``Result``) and how it ended."""
    result = child.result
    outcome = "crash" if child.outcome == "error" else child.outcome
    measured = {f.name: getattr(result, f.name) for f in fields(Measured)}
    if outcome == "pruned":
        measured["window_rates"] = [s["rate"] for s in result.segments or [] if not s["warmup"] and s["rate"]]
    burst = measured["burst_seconds"]
    knobs = knob_attrs(resolved, result.knobs_effective or {}, result.not_exercised)
    rec = TrialRecord(
        outcome=outcome, is_baseline=is_baseline, trial_seconds=round(child.wall_seconds, 3),
        knobs={name: KnobEntry.from_attr(attr) for name, attr in knobs.items()},
        overhead_seconds=round(child.wall_seconds - burst, 3) if burst is not None else None,
        failure=child.failure or None,
        # for the trial's note: what it printed last
        output_tail=child.output_tail if outcome != "ok" and child.output_tail
        and child.output_tail not in (child.failure or "") else None,
        **measured)
    if outcome == "ok" and rec.samples_per_second is None:
        rec = rec.but(outcome="crash", failure="the child reported no measured window")
    return Measurement(rec)


def measure_baseline(plan: Plan, resolved: dict[str, Resolved], tick: Callable[[float], None] | None = None,
                     keep: Path | None = None, cancel: threading.Event | None = None,
                     placements: list[Partition] | None = None) -> Measurement:
    """The baseline, measured ``[guard] baseline_runs`` times with seeds seed, seed+1, ...: its
    accuracy is their mean (their spread widens the guard), its rate their median. With several
    ``placements`` (shares of one shape: nothing else runs beside the baseline) its runs go
    side by side, one per share; else one after the other, the first alone."""
    runs = plan.definition.guard.baseline_runs
    side_by_side = bool(placements) and len(placements) > 1 and plan.definition.guard.accuracy  # type: ignore[arg-type]
    shares = placements if side_by_side else [plan.placement]
    measurements: list[Measurement] = []
    for start in range(0, runs, len(shares)):  # (a batch of one share: one run after the other)
        batch = range(start, min(runs, start + len(shares)))
        with ThreadPoolExecutor(max_workers=len(batch), thread_name_prefix="knobtune-baseline") as pool:
            futures = [pool.submit(measure, replace(plan, placement=shares[i - start]), resolved, True,  # type: ignore[index]
                                   tick=tick if i == start else None, seed_offset=i, cancel=cancel,
                                   keep=keep if i == 0 else None) for i in batch]
            measurements += [f.result() for f in futures]
        if measurements[0].outcome != "ok" or measurements[0].val_accuracy is None:
            return measurements[0]  # (no accuracy to average: the first run is the baseline)
    measured = measurements[0]
    if runs < 2:
        return measured
    ok = [r for r in measurements if r.outcome == "ok" and r.val_accuracy is not None]
    rates = [r.samples_per_second for r in ok if r.samples_per_second]
    return measured.but(
        baseline_runs=[{"seed_offset": i, "outcome": r.outcome, "val_accuracy": r.val_accuracy,
                        "samples_per_second": r.samples_per_second, "placement": r.record.placement}
                       for i, r in enumerate(measurements)],
        baseline_accuracies=[r.val_accuracy for r in ok],
        val_accuracy=statistics.fmean(r.val_accuracy for r in ok),  # type: ignore[misc]
        samples_per_second=statistics.median(rates) if rates else measured.samples_per_second)


def without_unexercised(plan: Plan, not_exercised: dict[str, str] | None) -> Plan:
    """``plan`` with the knobs the script never exercises no longer searched (their values
    cannot make a difference): each keeps the baseline's value (so a derived figure such as
    the learning-rate scale does not move), and trials record it as not applied, with the reason."""
    if not not_exercised:
        return plan
    offer = plan.offer
    gone = [k for k in not_exercised if len(offer.choices.get(k, ())) > 1]
    if not gone:
        return plan
    base = plan.space.defaults(plan.ctx, plan.definition.baseline)
    choices = {k: ([base[k]] if k in gone else v) for k, v in offer.choices.items()}
    return replace(plan, offer=replace(offer, choices=choices))


def suggest(plan: Plan, trial: optuna.Trial) -> dict[str, Resolved]:
    """Every knob's value for ``trial``: suggested by the sampler, or its default and why."""
    return plan.space.resolve(plan.space.suggest(trial, plan.offer), plan.offer, plan.ctx)


def known_invalid(plan: Plan, values: dict[str, Any]) -> str | None:
    """Why a combination of knob values cannot train here, known before any child runs: the
    space's own rule (``Space.invalid``) and, for a workload knobtune builds the loader of (built
    in, or a ``module:factory``) in one process, a burst too short for its batch size and steps per
    call (the child's schedule would refuse it; a script's own batch, or a rank's, is only known
    inside it)."""
    problem = plan.space.invalid(values, plan.ctx)
    if problem or plan.definition.study.script or plan.nproc != 1 or not values.get("batch_size"):
        return problem
    try:
        make_schedule(plan.request(values).burst, int(values["batch_size"]), int(values.get("accumulation_steps") or 1),
                      int(values.get("steps_per_execution") or 1))
    except InvalidKnobs as exc:
        return str(exc)
    return None


def measure(plan: Plan, resolved: dict[str, Resolved], is_baseline: bool,
            tick: Callable[[float], None] | None = None,
            watch: Callable[[list[dict[str, Any]]], str | None] | None = None, seed_offset: int = 0,
            keep: Path | None = None, cancel: threading.Event | None = None) -> Measurement:
    """Run the burst in a child and report what it measured (``watch`` may prune it). A
    combination the space knows cannot train correctly here is ``invalid`` without a child.
    ``keep``: a directory for the child's output and request (the trial's artifacts). The child
    runs on ``plan.placement`` (a partition of the machine) when the run divides it."""
    values = {name: r.value for name, r in resolved.items()}
    problem = known_invalid(plan, values)
    if problem:
        return measurement_from_child(ChildResult("invalid", failure=problem), resolved, is_baseline)
    request = plan.request(values, seed_offset)
    child = run_child(plan.definition.study.framework, "burst", request, plan.definition.burst.timeout_s,
                      tick=tick, watch=watch, keep=keep, placement=plan.placement, cancel=cancel)
    return measurement_from_child(child, resolved, is_baseline)


def prune_rule(plan: Plan, study: optuna.Study) -> Callable[[list[dict[str, Any]]], str | None] | None:
    """The early stop for this study's next trial, or None (pareto mode, pruning off, no best yet).

    throughput: once half the windows (at least 2) are measured, stop when their median rate is
    under ``prune_below`` x the best's. time-to-accuracy: stop when the training time already
    spent is over the best's time to accuracy / ``prune_below``.
    """
    cfg = plan.definition.study
    best = results.searched_best(study)
    if cfg.objective == "pareto" or not cfg.prune_below or best is None:
        return None
    ratio, windows = cfg.prune_below, plan.definition.burst_windows()
    if cfg.objective == "time-to-accuracy":
        limit = best.value / ratio

        def too_slow_to_target(segments: list[dict[str, Any]]) -> str | None:
            spent = sum(s["seconds"] for s in segments)
            if spent > limit:
                return (f"pruned: {spent:.1f} s of training without reaching the target, over "
                        f"{limit:.1f} s ({1 / ratio:.0f}x the best's {best.value:.1f} s, trial #{best.number})")
            return None

        return too_slow_to_target
    best_rate = TrialRecord.of(best).samples_per_second
    need = max(2, windows // 2)

    def too_slow(segments: list[dict[str, Any]]) -> str | None:
        rates = [s["rate"] for s in segments if not s["warmup"] and s["rate"]]
        if len(rates) < need or len(rates) >= windows:
            return None
        running = results.median(rates) or 0.0
        if running < ratio * best_rate:
            return (f"pruned after {len(rates)} of {windows} windows: {running:,.0f} samples/s is under "
                    f"{ratio:.0%} of the best's {best_rate:,.0f} (trial #{best.number})")
        return None

    return too_slow


def duplicate_of(study: optuna.Study, trial: optuna.Trial, running: set[int] = frozenset()) -> int | None:  # type: ignore[assignment]
    """The number of a finished trial, or of one this run is measuring (``running``), with exactly
    these params, if any. (A RUNNING trial of a run that died elsewhere does not count.)"""
    params = trial.params
    states = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
    for other in study.get_trials(deepcopy=False, states=states):
        if other.number == trial.number or (other.state == TrialState.RUNNING and other.number not in running):
            continue
        if other.params == params:
            return other.number
    return None


def accuracy_floor(baseline_accuracies: list[float], max_drop: float) -> float:
    """The accuracy a trial must reach: the baseline's mean accuracy minus ``max_drop``, minus the
    baseline's own seed-to-seed spread (sample standard deviation; 0 with one measurement), so
    that a configuration as good as the baseline is not rejected by the noise of one run."""
    mean = statistics.fmean(baseline_accuracies)
    spread = statistics.stdev(baseline_accuracies) if len(baseline_accuracies) > 1 else 0.0
    return round(mean - max_drop - spread, 6)


def final_floor(baseline_accuracies: list[float], max_drop: float) -> float:
    """The floor of the final verdict, once every configuration in contention has been measured
    with several seeds: the baseline's mean accuracy minus ``max_drop``, without the search's
    allowance for noise (the candidates' own means are compared with it)."""
    return round(statistics.fmean(baseline_accuracies) - max_drop, 6)


def verdict_floor(definition: Definition, baseline: TrialRecord | None) -> float | None:
    """``final_floor`` of ``baseline``'s measured accuracies; None when the guard is not on
    accuracy, the objective sets its own target (time-to-accuracy) or no accuracy is known."""
    if definition.study.objective == "time-to-accuracy" or not definition.guard.accuracy or baseline is None:
        return None
    accuracies = baseline.measured_accuracies
    return final_floor(accuracies, definition.guard.max_accuracy_drop) if accuracies else None


def objective_values(measured: Measurement, definition: Definition, base_accuracies: list[float] | None
                     ) -> tuple[list[float], float, dict[str, Any]]:
    """An ok trial's values (one per study direction), its accuracy constraint, extra fields of
    its record. ``base_accuracies`` are the baseline's accuracies (None: this trial is the baseline)."""
    cfg, a = definition.study, measured.record
    extra: dict[str, Any] = {}
    rate = a.samples_per_second
    if cfg.job_samples:
        rate = extra["effective_samples_per_second"] = results.effective_rate(
            a.samples_per_second, a.warmup_seconds or 0.0, cfg.job_samples)  # type: ignore[arg-type]
    if cfg.objective == "time-to-accuracy":
        reached = [e["accuracy"] for e in a.evaluations or []] + [a.val_accuracy]
        extra["accuracy_reached"] = max(reached)  # type: ignore[type-var]
        constraint = round(cfg.target_accuracy - extra["accuracy_reached"], 6)
        if a.target_reached:
            constraint = min(constraint, 0.0)
        # Not reached: the training time it spent without reaching the target (a real measurement).
        seconds = a.time_to_accuracy if a.target_reached else (a.burst_seconds or 0.0)
        return [seconds], constraint, extra  # type: ignore[list-item]
    if not definition.guard.accuracy:  # [guard] accuracy = false: throughput alone
        return [rate], 0.0, extra  # type: ignore[list-item]
    reference = a.measured_accuracies if base_accuracies is None else base_accuracies
    floor = accuracy_floor(reference, definition.guard.max_accuracy_drop)
    extra["accuracy_floor"] = floor
    constraint = round(floor - a.val_accuracy, 6)  # type: ignore[operator]
    values = [rate, a.val_accuracy] if cfg.objective == "pareto" else [rate]
    return values, constraint, extra  # type: ignore[return-value]


def memory_constraint(record: TrialRecord, definition: Definition) -> float | None:
    """How far the trial's peak memory passes ``[guard] max_memory_fraction`` of what it may use
    (the GPU's memory; on a CPU the host memory the child could grow into): > 0 is infeasible,
    since production would have less headroom than asked for. None where either is unknown."""
    peak, limit = record.peak_memory_mb, record.memory_limit_mb
    if not peak or not limit:
        return None
    return round(peak / limit - definition.guard.max_memory_fraction, 6)


def tell(study: optuna.Study, trial: optuna.Trial, measured: Measurement, definition: Definition,
         base_accuracies: list[float] | None) -> TrialRecord:
    """Store the trial's record and tell Optuna its values, constraints and state; returns the record."""
    rec = measured.record
    if rec.samples_per_second_cv is not None:
        # a read-ahead the burst had no room to train through also makes the windows unreliable
        rec = rec.but(noisy=rec.samples_per_second_cv > definition.confirm.noise_cv or rec.unsettled is not None)
    if measured.outcome == "pruned":
        record.write(trial, rec := rec.but(feasible=False))
        if len(study.directions) == 1:
            for step, rate in enumerate(rec.window_rates or []):
                trial.report(rate, step)
        study.tell(trial, state=TrialState.PRUNED)
        return rec
    if measured.outcome == "ok" and (rec.val_accuracy is not None or not definition.guard.accuracy):
        values, constraint, extra = objective_values(Measurement(rec), definition, base_accuracies)
        memory = memory_constraint(rec, definition)
        if memory is not None:
            extra["memory_fraction"] = round(rec.peak_memory_mb / rec.memory_limit_mb, 4)  # type: ignore[operator]
        rec = rec.but(**extra, feasible=constraint <= 0 and (memory is None or memory <= 0))
        record.write(trial, rec)
        trial.set_constraint("accuracy", constraint)
        if memory is not None:
            trial.set_constraint("memory", memory)
        trial.set_constraint("outcome", 0.0)
        study.tell(trial, values)
        return rec
    record.write(trial, rec := rec.but(feasible=False))
    trial.set_constraint("accuracy", 1.0)
    trial.set_constraint("outcome", 1.0)
    study.tell(trial, state=TrialState.PRUNED)
    return rec
