"""Running a study, from the study file to the confirmed winner.

- ``definition``: the study file, parsed and validated into dataclasses.
- ``study``: create or resume the Optuna study, then search, confirm and diagnose (``run``).
- ``loop``: the trial loop: ask, measure, tell, on one machine or as one of several workers.
- ``objective``: one trial: the knobs suggested, the child's request, its result told to Optuna.
- ``confirm``: the top candidates re-measured against the baseline, interleaved.
- ``warmstart``: earlier studies' winners queued first.
- ``diagnose``: input and compute ceilings (is the job input-bound?).
"""
from __future__ import annotations

from knobtune.search.study.definition import Definition, load
from knobtune.search.study.study import make_plan, run

__all__ = ["Definition", "load", "make_plan", "run"]
