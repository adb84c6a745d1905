"""knobtune for PyTorch: ``Tuned``, the integration API for your own training script, and
``Workload`` (with ``accuracy`` and ``adam``), the contract for a workload trained by the built-in
loop::

    from knobtune.pytorch import Tuned

The names are imported on first use, so that a trial child can check the torch version before
anything imports torch's submodules.
"""
from __future__ import annotations

from typing import Any

__all__ = ["Tuned", "Workload", "accuracy", "adam"]


def __getattr__(name: str) -> Any:
    if name == "Tuned":
        from knobtune.trainers.pytorch.tuned import Tuned

        return Tuned
    if name in __all__:
        from knobtune.trainers.pytorch import workload

        return getattr(workload, name)
    raise AttributeError(f"module 'knobtune.pytorch' has no attribute {name!r}")
