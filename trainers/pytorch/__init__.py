"""The PyTorch trainer. ``Tuned`` is the integration API for a user's own training script;
``Workload`` is the contract for user workloads trained by the built-in loop.

The names are imported on first use, so that ``python -m trainers.pytorch`` can check the torch
version before anything imports torch's submodules.
"""
from __future__ import annotations

from typing import Any

__all__ = ["Tuned", "Workload", "accuracy", "adam"]


def __getattr__(name: str) -> Any:
    if name == "Tuned":
        from trainers.pytorch.tuned import Tuned

        return Tuned
    if name in __all__:
        from trainers.pytorch import workload

        return getattr(workload, name)
    raise AttributeError(f"module 'trainers.pytorch' has no attribute {name!r}")
