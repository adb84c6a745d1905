"""The PyTorch trainer. ``Workload`` is the contract for user workloads.

The names are imported on first use, so that ``python -m trainers.pytorch`` can check the torch
version before anything imports torch's submodules.
"""
from __future__ import annotations

from typing import Any

__all__ = ["Workload", "accuracy", "adam"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from trainers.pytorch import workload

        return getattr(workload, name)
    raise AttributeError(f"module 'trainers.pytorch' has no attribute {name!r}")
