"""Bottleneck diagnosis: is a configuration limited by its input pipeline or by compute?

The input ceiling is the data pipeline alone (as configured, and with the framework's most
parallel loader settings; the faster counts), the compute ceiling the train step on one batch
already on the device. The lower ceiling names the bottleneck; a tuned config can approach it.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, TextIO

import optuna

from knobtune.search.launch.runner import run_child
from knobtune.search.storage.record import mark_study
from knobtune.search.study.objective import Plan


def undiagnosable(plan: Plan) -> str | None:
    """Why this study's job cannot be diagnosed (None: it can): the compute ceiling times the
    script's own step on one batch, and a trainer library's script trains in the library's loop."""
    integration = (plan.ctx.get("workload") or {}).get("integration")
    if integration:
        return (f"no bottleneck diagnosis: it times the script's own step on one batch, and this script trains in "
                f"{integration}'s own loop")
    return None


def ceilings(plan: Plan, params: dict[str, Any]) -> dict[str, Any]:
    """Input and compute ceilings (samples/s) of one configuration, measured in a child."""
    resolved = plan.space.resolve(params, plan.offer, plan.ctx)
    request = replace(plan.request({name: r.value for name, r in resolved.items()}),
                      input_variants={"as configured": {}, **plan.space.input_variants(plan.ctx)})
    child = run_child(plan.definition.study.framework, "diagnose", request, plan.definition.burst.timeout_s * 2,
                      placement=plan.placement)
    if child.outcome != "ok":
        return {"error": child.reason()}
    result = child.result
    # a data-parallel study's diagnosis runs on one rank (replica) alone: its compute ceiling, times the ranks, is
    # the group's; so is the input ceiling of PyTorch's ranks (a loader each), not of TensorFlow's replicas (one
    # pipeline feeds them all, and the diagnosis measured it on the trial's whole share)
    n = plan.nproc
    loaders = n if plan.definition.study.members == "ranks" else 1
    inputs = result.input_samples_per_second * loaders  # type: ignore[operator]
    compute = result.compute_samples_per_second * n  # type: ignore[operator]
    limit = "input" if inputs < compute else "compute"
    return {"input": inputs, "compute": compute, "bottleneck": limit, **({"ranks": n} if n > 1 else {}),
            "input_variants": {k: v * loaders for k, v in (result.input_variants or {}).items()}}


def diagnose_study(study: optuna.Study | None, plan: Plan, baseline_params: dict[str, Any],
                   winner: Any | None, err: TextIO) -> dict[str, Any]:
    """Diagnose the baseline and (when there is one) the winner; stored on the study if given."""
    err.write("knobtune: diagnosing the bottleneck (input and compute ceilings) ...\n")
    record: dict[str, Any] = {"baseline": ceilings(plan, baseline_params)}
    if winner is not None:
        record["winner"] = ceilings(plan, dict(winner.params))
        record["winner_trial"] = winner.number
    if study is not None:
        mark_study(study, diagnosis=record)
    return record
