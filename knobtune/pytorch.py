"""knobtune for PyTorch: ``Tuned``, the integration API for your own training script, and
``Workload`` (with ``accuracy`` and ``adam``), the contract for a workload trained by the built-in
loop::

    from knobtune.pytorch import Tuned

The names are imported on first use, so that a trial child can check the torch version before
anything imports torch's submodules.
"""
from __future__ import annotations

from knobtune._faces import NAMES, lazy

__all__ = list(NAMES)
__getattr__ = lazy("pytorch")
