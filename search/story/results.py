"""Reading a study's trials: finished, baseline, feasible, best (per objective mode), the Pareto
front and its picks, the confirmed winner. One definition of each, used by the run summary,
export, compare and the benchmarks alike."""
from __future__ import annotations

import statistics
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
DIRECTIONS = {"throughput": ["maximize"], "pareto": ["maximize", "maximize"], "time-to-accuracy": ["minimize"]}
PICKS = ("fastest-feasible", "knee", "most-accurate")


def mode(study: optuna.Study) -> str:
    return study.user_attrs.get("definition", {}).get("study", {}).get("objective", "throughput")


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
    found = [t for t in finished(study) if t.user_attrs.get("is_baseline")]
    ok = [t for t in found if t.user_attrs.get("outcome") == "ok"]
    return (ok or found or [None])[-1]


def infeasible_why(attrs: dict[str, Any]) -> str:
    """Why an ok trial is infeasible, in a few words: under the accuracy floor, or its peak memory
    over the headroom ``[guard] max_memory_fraction`` leaves."""
    accuracy, floor = attrs.get("val_accuracy"), attrs.get("accuracy_floor")
    if accuracy is not None and floor is not None and accuracy < floor:
        return f"below accuracy guard ({floor:.3f})"
    if attrs.get("memory_fraction") is not None:
        return (f"over memory headroom (peak {attrs['peak_memory_mb']:,.0f} MB, {attrs['memory_fraction']:.0%} of "
                f"the {attrs['memory_limit_mb']:,.0f} MB it may use)")
    return f"below accuracy guard ({floor or 0:.3f})"


def is_feasible(trial: FrozenTrial) -> bool:
    return (
        trial.state == TrialState.COMPLETE
        and trial.user_attrs.get("outcome") == "ok"
        and all(v <= 0 for v in trial.constraints.values())
    )


def feasible(study: optuna.Study) -> list[FrozenTrial]:
    return [t for t in finished(study) if is_feasible(t)]


def rate(trial: FrozenTrial) -> float:
    """The throughput a trial is ranked by: effective samples/s when the study plans a job length."""
    return trial.user_attrs.get("effective_samples_per_second", trial.user_attrs["samples_per_second"])


def front(study: optuna.Study) -> list[FrozenTrial]:
    """Feasible trials no other feasible trial beats on both samples/s and accuracy."""
    candidates = feasible(study)
    out = []
    for t in candidates:
        a, acc = rate(t), t.user_attrs["val_accuracy"]
        dominated = any(rate(o) >= a and o.user_attrs["val_accuracy"] >= acc
                        and (rate(o) > a or o.user_attrs["val_accuracy"] > acc) for o in candidates)
        if not dominated:
            out.append(t)
    return sorted(out, key=rate)


def pick_from_front(points: list[FrozenTrial], pick: str) -> FrozenTrial | None:
    """fastest-feasible, most-accurate, or knee: the front point nearest the utopia point (best
    rate and best accuracy) once both are scaled to [0, 1] over the front."""
    if not points:
        return None
    if pick == "fastest-feasible":
        return max(points, key=lambda t: (rate(t), t.user_attrs["val_accuracy"]))
    if pick == "most-accurate":
        return max(points, key=lambda t: (t.user_attrs["val_accuracy"], rate(t)))
    if pick != "knee":
        raise ValueError(f"unknown pick {pick!r}: expected one of {', '.join(PICKS)}")
    rates = [rate(t) for t in points]
    accs = [t.user_attrs["val_accuracy"] for t in points]

    def scaled(value: float, values: list[float]) -> float:
        span = max(values) - min(values)
        return (value - min(values)) / span if span else 1.0

    return min(points, key=lambda t: (1 - scaled(rate(t), rates)) ** 2
               + (1 - scaled(t.user_attrs["val_accuracy"], accs)) ** 2)


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
    confirmed = study.user_attrs.get("confirmed")
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
    return {name: entry["value"] for name, entry in trial.user_attrs.get("knobs", {}).items()}


def outcome_counts(study: optuna.Study) -> dict[str, int]:
    counts: dict[str, int] = {}
    for trial in finished(study):
        outcome = trial.user_attrs.get("outcome", "?")
        if outcome == "ok" and not is_feasible(trial):
            outcome = "target not reached" if mode(study) == "time-to-accuracy" else "below accuracy guard"
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None
