"""Ask a framework child what the machine is and what the workload looks like.

The parent never imports a framework (and never initialises CUDA), so hardware facts and the
workload's shape come from this probe, which also prepares the built-in data.
"""
from __future__ import annotations

import importlib.util
import os
from typing import Any

from search.errors import RunError, UserError
from search.runner import run_child
from trainers.common.builtins import FRAMEWORK_MODULES

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


def probe(framework: str, workload: str | None = None, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Fingerprint (and workload description when ``workload`` is given) from a child."""
    require_framework(framework)
    request = {"workload": workload, "workload_options": options or {}, "workdir": os.getcwd()}
    child = run_child(framework, "probe", request, PROBE_TIMEOUT_S)
    if child.outcome == "error":
        raise UserError(child.failure or "the workload could not be built")
    if child.returncode != 0 or "fingerprint" not in child.data:
        raise RunError(f"the {framework} probe failed: {child.failure}")
    return child.data
