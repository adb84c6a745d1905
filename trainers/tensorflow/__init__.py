"""The TensorFlow trainer (Keras 3). ``Workload`` is the contract for user workloads."""
from __future__ import annotations

import os

# Before TensorFlow loads: its C++ start-up chatter would bury a crash's real last lines.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from trainers.tensorflow.workload import Workload, accuracy, adam  # noqa: E402

__all__ = ["Workload", "accuracy", "adam"]
