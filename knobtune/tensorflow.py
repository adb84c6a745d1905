"""knobtune for TensorFlow (Keras 3): ``Tuned``, the integration API for your own training script,
and ``Workload`` (with ``accuracy`` and ``adam``), the contract for a workload trained by the
built-in loop::

    from knobtune.tensorflow import Tuned

The names are imported on first use, so that a trial child can check the TensorFlow and Keras
versions before anything imports Keras.
"""
from __future__ import annotations

from typing import Any

import knobtune.trainers.tensorflow  # noqa: F401  (quiets TensorFlow's C++ start-up before it loads)

__all__ = ["Tuned", "Workload", "accuracy", "adam"]


def __getattr__(name: str) -> Any:
    if name == "Tuned":
        from knobtune.trainers.tensorflow.tuned import Tuned

        return Tuned
    if name in __all__:
        from knobtune.trainers.tensorflow import workload

        return getattr(workload, name)
    raise AttributeError(f"module 'knobtune.tensorflow' has no attribute {name!r}")
