"""Which PyTorch failures are the machine running out of memory (outcome ``oom``), not a crash."""
from __future__ import annotations

import signal
from typing import Iterable

import torch

from knobtune.trainers.common import faults

MARKERS = (*faults.ALLOCATION_FAILURES, "CUFFT_ALLOC_FAILED")


def oom_reason(exc: BaseException, worker_exit_codes: Iterable[int] = ()) -> str | None:
    """The failure text for an out-of-memory exception, or None when ``exc`` is something else.
    ``worker_exit_codes`` are the DataLoader workers' exit codes: a worker killed by SIGKILL is,
    in practice, the kernel's out-of-memory killer (knobtune kills whole process groups, never
    one worker)."""
    text = str(exc)
    killed = -signal.SIGKILL in list(worker_exit_codes) or "killed by signal: Killed" in text
    if isinstance(exc, RuntimeError) and "DataLoader worker" in text and killed:
        return (f"out of memory: a DataLoader worker was killed by SIGKILL (most likely the kernel's "
                f"out-of-memory killer): {faults.first_line(exc)}")
    return faults.oom_reason(exc, (torch.OutOfMemoryError, MemoryError), (RuntimeError,), MARKERS)
