"""Which PyTorch failures are the machine running out of memory (outcome ``oom``), not a crash."""
from __future__ import annotations

import signal
from typing import Iterable

import torch

# cuBLAS/cuDNN report a failed workspace or handle allocation as a RuntimeError, not as
# torch.OutOfMemoryError; a DataLoader worker killed by SIGKILL is, in practice, the kernel's
# out-of-memory killer (knobtune kills whole process groups, never one worker).
OOM_MESSAGES = (
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_NOT_ENOUGH_WORKSPACE",
    "CUFFT_ALLOC_FAILED",
    "is killed by signal: Killed",
)
OOM_TYPES: tuple[type[BaseException], ...] = (torch.OutOfMemoryError, MemoryError)


def oom_reason(exc: BaseException, worker_exit_codes: Iterable[int] = ()) -> str | None:
    """The failure text for an out-of-memory exception, or None when ``exc`` is something else.
    ``worker_exit_codes`` are the DataLoader workers' exit codes (-9: killed by SIGKILL)."""
    text = str(exc)
    first = text.splitlines()[0] if text else type(exc).__name__
    if isinstance(exc, OOM_TYPES):
        return f"out of memory: {first}"
    if isinstance(exc, RuntimeError) and "DataLoader worker" in text and -signal.SIGKILL in list(worker_exit_codes):
        return (f"out of memory: a DataLoader worker was killed by SIGKILL (most likely the kernel's "
                f"out-of-memory killer): {first}")
    if isinstance(exc, RuntimeError):
        for marker in OOM_MESSAGES:
            if marker in text:
                if "Killed" in marker:
                    return (f"out of memory: a DataLoader worker was killed by SIGKILL (most likely the kernel's "
                            f"out-of-memory killer): {first}")
                return f"out of memory: {first}"
    return None
