"""Errors a trainer child reports as something other than a crash."""
from __future__ import annotations

# A process ended by a SIGKILL no part of knobtune sent (a trial's child, a rank of its group): outcome oom.
KILLED_UNASKED = "killed by SIGKILL that knobtune did not send (most likely the kernel's out-of-memory killer)"


class WorkloadError(ValueError):
    """The workload cannot be built: unknown name, bad factory, missing or corrupt data files.

    This is the user's input being wrong, so the engine reports it in one line and exits 2.
    """


class InvalidKnobs(ValueError):
    """The framework rejects this knob combination; the trial's outcome is ``invalid``."""
