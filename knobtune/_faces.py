"""The public faces' lazy names, the same for every framework."""
from __future__ import annotations

import importlib
from typing import Any, Callable

NAMES = ("Tuned", "Workload", "accuracy", "adam")


def lazy(framework: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``knobtune.<framework>``: ``Tuned`` and the workload contract,
    imported on first use (so that a trial child checks the framework's version before anything
    imports the framework's submodules)."""

    def __getattr__(name: str) -> Any:
        if name == "Tuned":
            return importlib.import_module(f"knobtune.trainers.{framework}.tuned").Tuned
        if name in NAMES:
            return getattr(importlib.import_module(f"knobtune.trainers.{framework}.workload"), name)
        raise AttributeError(f"module 'knobtune.{framework}' has no attribute {name!r}")

    return __getattr__
