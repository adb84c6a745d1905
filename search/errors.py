"""The two ways a command fails: the user's input (exit 2) or the run itself (exit 1)."""
from __future__ import annotations


class UserError(Exception):
    """Bad input (study file, workload, storage URL, arguments): one line, exit 2, no traceback."""


class RunError(Exception):
    """The run could not go on (e.g. the baseline trial failed): one line, exit 1."""
