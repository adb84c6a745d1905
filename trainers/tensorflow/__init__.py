"""The TensorFlow trainer (Keras 3). ``Tuned`` is the integration API for a user's own training
script; ``Workload`` is the contract for user workloads trained by the built-in loop.

The names are imported on first use, so that ``python -m trainers.tensorflow`` can check the
TensorFlow and Keras versions before anything imports Keras.
"""
from __future__ import annotations

import os
from typing import Any

# Before TensorFlow loads: its C++ start-up chatter would bury a crash's real last lines.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

__all__ = ["Tuned", "Workload", "accuracy", "adam"]


def __getattr__(name: str) -> Any:
    if name == "Tuned":
        from trainers.tensorflow.tuned import Tuned

        return Tuned
    if name in __all__:
        from trainers.tensorflow import workload

        return getattr(workload, name)
    raise AttributeError(f"module 'trainers.tensorflow' has no attribute {name!r}")
