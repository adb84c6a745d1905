"""Running a study, from the study file to the confirmed winner.

- ``definition``: the study file, parsed and validated into dataclasses.
- ``study``: create or resume the Optuna study, then search, confirm and diagnose (``run``).
- ``loop``: the trial loop: ask, measure, tell (Optuna's ``_optimize``/``_tell``), one trial per slot.
- ``queue``: the queue policy: the baseline first, then the warm start and the seeds' advice, an
  unmeasured configuration in place of a duplicate proposal.
- ``survival``: what a worker among others on a shared study does (retries, the queue's lease,
  heartbeats, silent trials re-queued); nothing when a run is alone on its study.
- ``objective``: one trial: the knobs suggested, the child's request, its result told to Optuna.
- ``confirm``: the top candidates re-measured against the baseline, interleaved.
- ``warmstart``: earlier studies' winners queued first.
- ``diagnose``: input and compute ceilings (is the job input-bound?).
"""
from __future__ import annotations

from knobtune.search.study.definition import Definition, load
from knobtune.search.study.study import make_plan, run

__all__ = ["Definition", "load", "make_plan", "run"]
