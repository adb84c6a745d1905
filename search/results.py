"""Reading a study's trials: finished, baseline, feasible, best. One definition of each, used by
the run summary, export and benchmarks alike."""
from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


def finished(study: optuna.Study) -> list[FrozenTrial]:
    """Trials that produced a result (any outcome); FAIL marks an interrupted trial."""
    return study.get_trials(deepcopy=False, states=FINISHED)


def baseline(study: optuna.Study) -> FrozenTrial | None:
    for trial in finished(study):
        if trial.user_attrs.get("is_baseline"):
            return trial
    return None


def is_feasible(trial: FrozenTrial) -> bool:
    return (
        trial.state == TrialState.COMPLETE
        and trial.user_attrs.get("outcome") == "ok"
        and all(v <= 0 for v in trial.constraints.values())
    )


def feasible(study: optuna.Study) -> list[FrozenTrial]:
    return [t for t in finished(study) if is_feasible(t)]


def best(study: optuna.Study) -> FrozenTrial | None:
    """The fastest feasible trial (ok outcome, accuracy guard passed)."""
    candidates = feasible(study)
    return max(candidates, key=lambda t: t.user_attrs["samples_per_second"]) if candidates else None


def knob_values(trial: FrozenTrial) -> dict[str, Any]:
    """The effective value of every knob of a trial (applied or not)."""
    return {name: entry["value"] for name, entry in trial.user_attrs.get("knobs", {}).items()}


def outcome_counts(study: optuna.Study) -> dict[str, int]:
    counts: dict[str, int] = {}
    for trial in finished(study):
        outcome = trial.user_attrs.get("outcome", "?")
        if outcome == "ok" and not is_feasible(trial):
            outcome = "below accuracy guard"
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts
