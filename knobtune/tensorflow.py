"""knobtune for TensorFlow (Keras 3): ``Tuned``, the integration API for your own training script,
and ``Workload`` (with ``accuracy`` and ``adam``), the contract for a workload trained by the
built-in loop::

    from knobtune.tensorflow import Tuned

The names are imported on first use, so that a trial child can check the TensorFlow and Keras
versions before anything imports Keras.
"""
from __future__ import annotations

import knobtune.trainers.tensorflow  # noqa: F401  (quiets TensorFlow's C++ start-up before it loads)
from knobtune._faces import NAMES, lazy

__all__ = list(NAMES)
__getattr__ = lazy("tensorflow")
