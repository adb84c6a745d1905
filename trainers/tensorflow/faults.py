"""Which TensorFlow failures are the machine running out of memory (outcome ``oom``), not a crash."""
from __future__ import annotations

import tensorflow as tf

from knobtune.trainers.common import faults

MARKERS = (*faults.ALLOCATION_FAILURES, "failed to allocate memory")


def oom_reason(exc: BaseException) -> str | None:
    """The failure text for an out-of-memory exception, or None when ``exc`` is something else."""
    return faults.oom_reason(exc, (tf.errors.ResourceExhaustedError, MemoryError), (tf.errors.OpError,), MARKERS)
