"""Out-of-memory classification shared by the trainers: each framework names its exception types
and the texts its libraries use for a failed allocation (cuBLAS/cuDNN report one as an ordinary
error, not as an out-of-memory exception)."""
from __future__ import annotations

ALLOCATION_FAILURES = ("CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED",
                       "CUDNN_STATUS_NOT_ENOUGH_WORKSPACE")


def first_line(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or str(exc)
    return text.splitlines()[0] if text else type(exc).__name__


def oom_reason(exc: BaseException, oom_types: tuple[type[BaseException], ...],
               error_types: tuple[type[BaseException], ...], markers: tuple[str, ...]) -> str | None:
    """``out of memory: ...`` when ``exc`` is one of ``oom_types``, or one of ``error_types``
    whose text holds one of ``markers``; None otherwise."""
    if isinstance(exc, oom_types):
        return f"out of memory: {first_line(exc)}"
    text = getattr(exc, "message", None) or str(exc)
    if isinstance(exc, error_types) and any(marker in text for marker in markers):
        return f"out of memory: {first_line(exc)}"
    return None
