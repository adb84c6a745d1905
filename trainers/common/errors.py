"""Errors a trainer child reports as something other than a crash."""
from __future__ import annotations


class WorkloadError(ValueError):
    """The workload cannot be built: unknown name, bad factory, missing or corrupt data files.

    This is the user's input being wrong, so the engine reports it in one line and exits 2.
    """


class InvalidKnobs(ValueError):
    """The framework rejects this knob combination; the trial's outcome is ``invalid``."""
