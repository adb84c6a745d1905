"""Which TensorFlow failures are the machine running out of memory (outcome ``oom``), not a crash."""
from __future__ import annotations

import tensorflow as tf

# cuBLAS/cuDNN handle or workspace allocation failures surface as InternalError with these texts.
OOM_MESSAGES = ("CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED", "CUDNN_STATUS_NOT_ENOUGH_WORKSPACE",
                "failed to allocate memory")
OOM_TYPES: tuple[type[BaseException], ...] = (tf.errors.ResourceExhaustedError, MemoryError)


def oom_reason(exc: BaseException) -> str | None:
    """The failure text for an out-of-memory exception, or None when ``exc`` is something else."""
    message = getattr(exc, "message", None) or str(exc)
    first = message.splitlines()[0] if message else type(exc).__name__
    if isinstance(exc, OOM_TYPES):
        return f"out of memory: {first}"
    if isinstance(exc, tf.errors.OpError) and any(marker in message for marker in OOM_MESSAGES):
        return f"out of memory: {first}"
    return None
