"""Reading a study's trials: finished, baseline, feasible, best (per objective mode), the Pareto
front and its picks, the confirmed winner. One definition of each, used by the run summary,
export, compare and the benchmarks alike."""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from knobtune.search.storage.record import StudyRecord, TrialRecord

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
DIRECTIONS = {"throughput": ["maximize"], "pareto": ["maximize", "maximize"], "time-to-accuracy": ["minimize"]}
PICKS = ("fastest-feasible", "knee", "most-accurate")


def mode(study: optuna.Study) -> str:
    return StudyRecord.of(study).objective


def effective_rate(samples_per_second: float, warmup_seconds: float, job_samples: int | None) -> float:
    """Throughput over a whole job of ``job_samples``: the warm-up is paid once, then the rate."""
    if not job_samples:
        return samples_per_second
    return job_samples / (warmup_seconds + job_samples / samples_per_second)


def finished(study: optuna.Study) -> list[FrozenTrial]:
    """Trials that produced a result (any outcome); FAIL marks an interrupted or skipped trial."""
    return study.get_trials(deepcopy=False, states=FINISHED)


def baseline(study: optuna.Study) -> FrozenTrial | None:
    """The latest finished baseline trial (a failed one is re-measured on resume)."""
    found = [t for t in finished(study) if TrialRecord.of(t).is_baseline]
    ok = [t for t in found if TrialRecord.of(t).ok]
    return (ok or found or [None])[-1]


def infeasible_why(rec: TrialRecord) -> str:
    """Why an ok trial is infeasible, in a few words: under the accuracy floor, or its peak memory
    over the headroom ``[guard] max_memory_fraction`` leaves."""
    accuracy, floor = rec.val_accuracy, rec.accuracy_floor
    if accuracy is not None and floor is not None and accuracy < floor:
        return f"below accuracy guard ({floor:.3f})"
    if rec.memory_fraction is not None:
        return (f"over memory headroom (peak {rec.peak_memory_mb or 0:,.0f} MB, {rec.memory_fraction:.0%} of "
                f"the {rec.memory_limit_mb or 0:,.0f} MB it may use)")
    return f"below accuracy guard ({floor or 0:.3f})"


def is_feasible(trial: FrozenTrial) -> bool:
    return (
        trial.state == TrialState.COMPLETE
        and TrialRecord.of(trial).ok
        and all(v <= 0 for v in trial.constraints.values())
    )


def feasible(study: optuna.Study) -> list[FrozenTrial]:
    return [t for t in finished(study) if is_feasible(t)]


def rate(trial: FrozenTrial) -> float:
    """The throughput a trial is ranked by: effective samples/s when the study plans a job length."""
    return TrialRecord.of(trial).rate  # type: ignore[return-value]


def accuracy(trial: FrozenTrial) -> float:
    """An ok trial's held-out accuracy (a trial on the front always has one)."""
    return TrialRecord.of(trial).val_accuracy  # type: ignore[return-value]


def front(study: optuna.Study) -> list[FrozenTrial]:
    """Feasible trials no other feasible trial beats on both samples/s and accuracy."""
    candidates = [(t, rate(t), accuracy(t)) for t in feasible(study)]
    out = []
    for t, a, acc in candidates:
        dominated = any(ra >= a and oa >= acc and (ra > a or oa > acc) for _, ra, oa in candidates)
        if not dominated:
            out.append(t)
    return sorted(out, key=rate)


def pick_from_front(points: list[FrozenTrial], pick: str) -> FrozenTrial | None:
    """fastest-feasible, most-accurate, or knee: the front point nearest the utopia point (best
    rate and best accuracy) once both are scaled to [0, 1] over the front."""
    if not points:
        return None
    if pick == "fastest-feasible":
        return max(points, key=lambda t: (rate(t), accuracy(t)))
    if pick == "most-accurate":
        return max(points, key=lambda t: (accuracy(t), rate(t)))
    if pick != "knee":
        raise ValueError(f"unknown pick {pick!r}: expected one of {', '.join(PICKS)}")
    rates = [rate(t) for t in points]
    accs = [accuracy(t) for t in points]

    def scaled(value: float, values: list[float]) -> float:
        span = max(values) - min(values)
        return (value - min(values)) / span if span else 1.0

    return min(points, key=lambda t: (1 - scaled(rate(t), rates)) ** 2
               + (1 - scaled(accuracy(t), accs)) ** 2)


def searched_best(study: optuna.Study, pick: str = "fastest-feasible") -> FrozenTrial | None:
    """The best feasible trial by the study's own measurements, before any confirmation."""
    m = mode(study)
    if m == "pareto":
        return pick_from_front(front(study), pick)
    candidates = feasible(study)
    if not candidates:
        return None
    if m == "time-to-accuracy":
        return min(candidates, key=lambda t: t.value)
    return max(candidates, key=lambda t: t.value)


def confirmation(study: optuna.Study) -> dict[str, Any] | None:
    """The confirmation record, when it covers the study's current trials."""
    confirmed = StudyRecord.of(study).confirmed
    if confirmed and confirmed.get("after_trials") == len(finished(study)):
        return confirmed
    return None


def best(study: optuna.Study, pick: str | None = None) -> FrozenTrial | None:
    """The winner: the confirmed one when a current confirmation exists (for the default pick),
    else the best by the study's own measurements."""
    confirmed = confirmation(study)
    if confirmed and confirmed.get("winner") is not None and pick in (None, confirmed.get("pick")):
        return study.trials[confirmed["winner"]]
    return searched_best(study, pick or "fastest-feasible")


def configurations(study: optuna.Study, running: set[int] | None = None) -> list[dict[str, Any]]:
    """The params of every trial measured, being measured (only ``running`` ones, when given)
    or waiting in the queue: what a new proposal must not repeat."""
    out = [dict(t.params) for t in finished(study)]
    out += [dict(t.params) for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if running is None or t.number in running]
    out += [dict(t.system_attrs.get("fixed_params", {}))
            for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))]
    return out


def knob_values(trial: FrozenTrial) -> dict[str, Any]:
    """The effective value of every knob of a trial (applied or not)."""
    return TrialRecord.of(trial).knob_values


def outcome_counts(study: optuna.Study) -> dict[str, int]:
    counts: dict[str, int] = {}
    for trial in finished(study):
        outcome = TrialRecord.of(trial).outcome or "?"
        if outcome == "ok" and not is_feasible(trial):
            outcome = "target not reached" if mode(study) == "time-to-accuracy" else "below accuracy guard"
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


@dataclass(frozen=True)
class Speedup:
    """How much faster the winner is than the baseline, and which measurement says so: the
    confirmation's median of per-round paired ratios (``rounds``), or, before a confirmation, the
    ratio of the two search trials' own figures (one trial each)."""

    value: float
    rounds: int | None = None  # confirmed over this many interleaved rounds; None: one search trial each
    range: tuple[float, float] | None = None

    @property
    def label(self) -> str:
        return f"median of {self.rounds} paired rounds" if self.rounds else "one search trial each"

    def __str__(self) -> str:
        return f"{self.value:.2f}x ({self.label})"


def search_speedup(trial: FrozenTrial, base: FrozenTrial, minimize: bool | None = None) -> float | None:
    """One search trial over the baseline trial: rates (seconds to target for time-to-accuracy,
    where ``minimize`` is true), with no pairing and no repeats."""
    if minimize:
        return base.value / trial.value if trial.value and base.value else None
    value, ref = rate(trial), rate(base)
    return value / ref if value and ref else None


def speedup(study: optuna.Study, trial: FrozenTrial | None = None) -> Speedup | None:
    """The speedup every presenter shows for ``trial`` (default: the winner): the confirmed paired
    median when the current confirmation crowned it, else its search trial over the baseline's."""
    trial = trial or best(study)
    base = baseline(study)
    if trial is None or base is None:
        return None
    confirmed = confirmation(study)
    if confirmed and confirmed.get("winner") == trial.number == base.number:  # the baseline held
        return Speedup(1.0, confirmed["repeats"])
    if confirmed and confirmed.get("winner") == trial.number and confirmed.get("speedup"):
        lo_hi = confirmed.get("speedup_range")
        return Speedup(confirmed["speedup"], confirmed["repeats"], tuple(lo_hi) if lo_hi else None)  # type: ignore[arg-type]
    value = search_speedup(trial, base, mode(study) == "time-to-accuracy")
    return Speedup(value) if value else None
