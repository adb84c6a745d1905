"""The scaling figure of a data-parallel study: what the extra ranks (PyTorch) or replicas
(TensorFlow's MirroredStrategy) buy.

For the baseline and the winner, the group and one rank alone (``solo``: no group, on one rank's
share of the trial's cores or GPU, training one rank's part of the burst) run back to back, so that
both see the machine in the same state (a shared machine's rate drifts by 20 % between minutes: the
trial's own rate, measured earlier, would not pair). Scaling efficiency = group rate / (nproc x the
one rank's rate): 1.0 is perfect, less is what communication, synchronisation and shared resources
(memory bandwidth, a CPU's caches) cost. A TensorFlow replica alone is the same process on the
same share without the strategy, training ``batch_size`` per step instead of ``batch_size`` x
replicas.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, TextIO

import optuna

from knobtune.search.launch.runner import run_child
from knobtune.search.storage.record import StudyRecord, mark_study
from knobtune.search.story import results
from knobtune.search.study.objective import Plan


def _rate(plan: Plan, knobs: dict[str, Any], solo: bool) -> tuple[float | None, str | None]:
    request = replace(plan.request(knobs), solo=solo)
    child = run_child(plan.definition.study.framework, "burst", request, plan.definition.burst.timeout_s,
                      placement=plan.placement)
    if child.outcome != "ok" or child.result.samples_per_second is None:
        return None, child.reason()
    return child.result.samples_per_second, None


def paired(plan: Plan, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` as the group and as one rank alone, back to back: both rates, the speedup and the
    efficiency; or the reason there is none."""
    resolved = plan.space.resolve(params, plan.offer, plan.ctx)
    knobs = {name: r.value for name, r in resolved.items()}
    group, failed = _rate(plan, knobs, solo=False)
    alone, failed_alone = _rate(plan, knobs, solo=True)
    if group is None or alone is None:
        one = f"one {plan.definition.study.members[:-1]} alone"
        return {"error": f"{'the group' if group is None else one}: {failed or failed_alone}"}
    return {"group": group, "one_rank": alone, "speedup": group / alone, "efficiency": group / (plan.nproc * alone)}


def measure_study(study: optuna.Study, plan: Plan, err: TextIO) -> dict[str, Any] | None:
    """Scaling of the baseline and the winner, stored on the study (once per winner); None when
    the study is not data-parallel or has no winner."""
    winner, base = results.best(study), results.baseline(study)
    if plan.nproc <= 1 or winner is None or base is None:
        return None
    done = StudyRecord.of(study).scaling or {}
    if done.get("winner_trial") == winner.number:
        return done
    members = plan.definition.study.members
    err.write(f"knobtune: scaling: the baseline and the winner as {plan.nproc} {members} and as one {members[:-1]} "
              f"alone, back to back ...\n")
    out: dict[str, Any] = {"nproc": plan.nproc, "members": members, "winner_trial": winner.number}
    out["baseline"] = paired(plan, dict(base.params))
    out["winner"] = out["baseline"] if winner.number == base.number else paired(plan, dict(winner.params))
    mark_study(study, scaling=out)
    return out

