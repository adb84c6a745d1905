"""Ask a framework child what the machine is and what the workload looks like.

The parent never imports a framework (and never initialises CUDA), so hardware facts and the
workload's shape come from this probe, which also prepares the built-in data.
"""
from __future__ import annotations

import importlib.util
import os
from typing import Any

from knobtune.search.errors import RunError, UserError
from knobtune.search.launch.partition import Partition
from knobtune.search.launch.runner import run_child
from knobtune.trainers.common.names import FRAMEWORK_MODULES
from knobtune.trainers.common.wire import Request

PROBE_TIMEOUT_S = 600.0
INSTALL_HINTS = {
    "pytorch": "pip install torch==2.13.0 (the CPU build; on a GPU box keep your CUDA build), "
               "or pip install 'knobtune[pytorch]'",
    "tensorflow": "pip install 'knobtune[tensorflow]' (tensorflow-cpu==2.21.0 on a CPU machine, tensorflow on a GPU box)",
}


def framework_installed(framework: str) -> bool:
    return importlib.util.find_spec(FRAMEWORK_MODULES[framework]) is not None


def require_framework(framework: str) -> None:
    if not framework_installed(framework):
        raise UserError(
            f"framework {framework!r} needs the {FRAMEWORK_MODULES[framework]!r} package, which this Python "
            f"does not have: {INSTALL_HINTS[framework]}"
        )


def probe(framework: str, workload: str | None = None, options: dict[str, Any] | None = None,
          script: str | None = None, args: tuple[str, ...] = (), placement: Partition | None = None,
          nproc: int = 1) -> dict[str, Any]:
    """Fingerprint (and a description of the workload, or of the script run up to its first
    batch, when one is given) from a child, as its result's JSON; on ``placement``, the
    fingerprint of that partition."""
    require_framework(framework)
    request = Request(workload=workload, workload_options=options or {}, workdir=os.getcwd(), script=script,
                      args=tuple(args), nproc=nproc)
    child = run_child(framework, "probe", request, PROBE_TIMEOUT_S, placement=placement)
    if child.outcome == "error":
        raise UserError(child.failure or "the workload could not be built")
    if script and child.outcome == "crash":
        raise UserError(f"the script {script} failed before its first batch: {child.failure}")
    if child.returncode != 0 or child.result.fingerprint is None:
        raise RunError(f"the {framework} probe failed: {child.failure}")
    return child.result.to_json()


def probe_study(definition: Any, err: Any, placement: Partition | None = None, nproc: int = 1) -> dict[str, Any]:
    """The probe for a study file's framework and workload (or script), announced on ``err``;
    with ``nproc`` > 1, on one rank's share (TensorFlow: the trial's, its replicas share one process),
    and what data-parallel trials can use there."""
    cfg = definition.study
    what = cfg.job if cfg.script else f"workload {cfg.workload!r}"
    share = (f"a trial's share ({nproc} replicas)" if nproc > 1 and cfg.members == "replicas" else
             f"one rank's share of {nproc}" if nproc > 1 else f"partition {placement.index}" if placement else "")
    where = f" on {share} (cores {','.join(map(str, placement.cores))}" + (
        f", GPU {placement.gpu})" if placement.gpu is not None else ")") if placement is not None else ""
    err.write(f"knobtune: probing {cfg.framework} and {what}{where} ...\n")
    return probe(cfg.framework, cfg.workload or None, definition.workload, cfg.script, cfg.args, placement, nproc)
