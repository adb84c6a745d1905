"""One trial, engine side: knobs from the space, a burst in a child, attributes and the verdict
told to Optuna. Non-ok outcomes never get a made-up objective value: they are told as PRUNED
with an infeasible constraint, which TPE learns from (FAIL trials it would ignore)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import optuna
from optuna.trial import TrialState

from search.definition import Definition
from search.runner import ChildResult, run_child
from spaces.knobs import Context, Offer, Resolved, Space

ATTR_FIELDS = (
    "samples_per_second", "samples_per_second_cv", "warmup_seconds", "val_accuracy", "final_loss",
    "effective_batch_size", "peak_memory_mb", "burst_seconds", "window_rates", "nan_step",
    "amp_skipped_steps", "loader", "pipeline", "applied",
)


@dataclass(frozen=True)
class Plan:
    """What every trial of a study shares."""

    definition: Definition
    space: Space
    offer: Offer
    ctx: Context
    workdir: str

    def request(self, knobs: dict[str, Any]) -> dict[str, Any]:
        burst = self.definition.burst
        return {
            "workload": self.definition.study.workload,
            "workload_options": self.definition.workload,
            "knobs": knobs,
            "burst": {
                "train_samples": burst.train_samples,
                "warmup_samples": burst.warmup_samples,
                "windows": burst.windows,
                "seed": self.definition.study.seed or 0,
            },
            "workdir": self.workdir,
        }


@dataclass
class Report:
    outcome: str
    attrs: dict[str, Any]

    @property
    def samples_per_second(self) -> float | None:
        return self.attrs.get("samples_per_second")

    @property
    def val_accuracy(self) -> float | None:
        return self.attrs.get("val_accuracy")


def knob_attrs(resolved: dict[str, Resolved], effective: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each knob's effective value: what the child read back for applied knobs, else the default."""
    out: dict[str, dict[str, Any]] = {}
    for name, entry in resolved.items():
        attr = entry.as_attr()
        if entry.applied and name in effective:
            attr["value"] = effective[name]
            if effective[name] != entry.value:
                attr["why"] = f"requested {entry.value!r}, the framework used {effective[name]!r}"
        out[name] = attr
    return out


def report_from_child(child: ChildResult, resolved: dict[str, Resolved], is_baseline: bool) -> Report:
    data = child.data
    outcome = "crash" if child.outcome == "error" else child.outcome
    attrs: dict[str, Any] = {
        "outcome": outcome,
        "is_baseline": is_baseline,
        "knobs": knob_attrs(resolved, data.get("knobs_effective", {})),
        "trial_seconds": round(child.wall_seconds, 3),
    }
    for key in ATTR_FIELDS:
        if data.get(key) is not None:
            attrs[key] = data[key]
    if "burst_seconds" in attrs:
        attrs["overhead_seconds"] = round(child.wall_seconds - attrs["burst_seconds"], 3)
    if child.failure:
        attrs["failure"] = child.failure
    if outcome == "ok" and "samples_per_second" not in attrs:
        attrs.update(outcome="crash", failure="the child reported no measured window")
    return Report(attrs["outcome"], attrs)


def suggest(plan: Plan, trial: optuna.Trial) -> dict[str, Resolved]:
    """Every knob's value for ``trial``: suggested by the sampler, or its default and why."""
    return plan.space.resolve(plan.space.suggest(trial, plan.offer), plan.offer, plan.ctx)


def measure(plan: Plan, resolved: dict[str, Resolved], is_baseline: bool,
            tick: Callable[[float], None] | None = None) -> Report:
    """Run the burst in a child and report what it measured."""
    request = plan.request({name: r.value for name, r in resolved.items()})
    child = run_child(plan.definition.study.framework, "burst", request, plan.definition.burst.timeout_s, tick=tick)
    return report_from_child(child, resolved, is_baseline)


def duplicate_of(study: optuna.Study, trial: optuna.Trial) -> int | None:
    """The number of a finished trial with exactly these params, if any."""
    params = trial.params
    for other in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        if other.params == params:
            return other.number
    return None


def accuracy_constraint(val_accuracy: float, baseline_accuracy: float, max_drop: float) -> float:
    """<= 0 when the trial keeps accuracy within ``max_drop`` of the baseline's."""
    return round((baseline_accuracy - max_drop) - val_accuracy, 6)


def tell(study: optuna.Study, trial: optuna.Trial, report: Report, baseline_accuracy: float | None,
         max_drop: float) -> None:
    """Store the attributes and tell Optuna the value, constraints and state."""
    for key, value in report.attrs.items():
        trial.set_user_attr(key, value)
    if report.outcome == "ok" and report.val_accuracy is not None:
        reference = report.val_accuracy if baseline_accuracy is None else baseline_accuracy
        constraint = accuracy_constraint(report.val_accuracy, reference, max_drop)
        trial.set_user_attr("accuracy_floor", round(reference - max_drop, 6))
        trial.set_user_attr("feasible", constraint <= 0)
        trial.set_constraint("accuracy", constraint)
        trial.set_constraint("outcome", 0.0)
        study.tell(trial, report.samples_per_second)
    else:
        trial.set_user_attr("feasible", False)
        trial.set_constraint("accuracy", 1.0)
        trial.set_constraint("outcome", 1.0)
        study.tell(trial, state=TrialState.PRUNED)


