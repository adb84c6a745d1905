"""The parent's side of the process boundary: every trial, probe and diagnosis runs in a child.

- ``runner``: run one child (``run_child``): request in, result out, timeout, process-group kill,
  the outcome classified.
- ``forkserver``: the warm servers children are forked from (the framework imported once).
- ``partition``: the machine's shares for ``--jobs`` (cores, one GPU) and pinning a child to one.
- ``probe``: the framework child that reports the hardware fingerprint and describes the workload.
"""
from __future__ import annotations

# (no name here is also a module's: ``from knobtune.search.launch import probe`` is the module)
from knobtune.search.launch.partition import Partition
from knobtune.search.launch.probe import framework_installed, probe_study
from knobtune.search.launch.runner import ChildResult, run_child

__all__ = ["ChildResult", "Partition", "framework_installed", "probe_study", "run_child"]
