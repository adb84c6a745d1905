"""The scaling figure of a data-parallel study: what the extra ranks buy.

For the baseline and the winner, one run of one rank alone (``solo``: no group, on one rank's share
of the trial's cores or GPU, training one rank's part of the burst) gives the rate the group would
reach if ``nproc`` ranks scaled perfectly; the group's rate is the trial's own measurement. Scaling
efficiency = group rate / (nproc x the one rank's rate): 1.0 is perfect, less is what communication,
synchronisation and shared resources (memory bandwidth, a CPU's caches) cost.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, TextIO

import optuna

from knobtune.search.launch.runner import run_child
from knobtune.search.storage.record import StudyRecord, TrialRecord, mark_study
from knobtune.search.story import results
from knobtune.search.study.objective import Plan


def one_rank(plan: Plan, params: dict[str, Any]) -> dict[str, Any]:
    """One rank's rate alone for ``params`` (samples/s), or the reason it has none."""
    resolved = plan.space.resolve(params, plan.offer, plan.ctx)
    request = replace(plan.request({name: r.value for name, r in resolved.items()}), solo=True)
    child = run_child(plan.definition.study.framework, "burst", request, plan.definition.burst.timeout_s,
                      placement=plan.placement)
    if child.outcome != "ok" or child.result.samples_per_second is None:
        return {"error": f"{child.outcome}: {(child.failure or '').splitlines()[0] if child.failure else ''}"}
    return {"one_rank": child.result.samples_per_second}


def figure(group_rate: float | None, alone: dict[str, Any], nproc: int) -> dict[str, Any]:
    """The group's rate against ``nproc`` times one rank's alone."""
    if "error" in alone or not group_rate:
        return {**alone, "group": group_rate}
    return {"group": group_rate, **alone, "speedup": group_rate / alone["one_rank"],
            "efficiency": group_rate / (nproc * alone["one_rank"])}


def measure_study(study: optuna.Study, plan: Plan, err: TextIO) -> dict[str, Any] | None:
    """Scaling of the baseline and the winner, stored on the study (once per winner); None when
    the study is not data-parallel or has no winner."""
    winner, base = results.best(study), results.baseline(study)
    if plan.nproc <= 1 or winner is None or base is None:
        return None
    done = StudyRecord.of(study).scaling or {}
    if done.get("winner_trial") == winner.number:
        return done
    err.write(f"knobtune: measuring one rank alone (baseline and winner) for the scaling over {plan.nproc} ranks ...\n")
    out: dict[str, Any] = {"nproc": plan.nproc, "winner_trial": winner.number}
    out["baseline"] = figure(TrialRecord.of(base).samples_per_second, one_rank(plan, dict(base.params)), plan.nproc)
    out["winner"] = out["baseline"] if winner.number == base.number else figure(
        TrialRecord.of(winner).samples_per_second, one_rank(plan, dict(winner.params)), plan.nproc)
    mark_study(study, scaling=out)
    return out

