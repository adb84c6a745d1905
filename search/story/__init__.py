"""Telling the story: everything that reads a study and shows what it found.

- ``results``: reading the stored trials (the baseline, the feasible ones, the winner).
- ``summary``: the table and lines printed at the end of a run; ``progress``: the live line.
- ``findings``: what a study found, as blocks rendered to Markdown (the dashboard's notes) or HTML.
- ``notes``: writing those notes and the metric names into the storage.
- ``htmlreport`` and ``charts``: ``knobtune report``'s one HTML file.
- ``compare``: two studies of one workload side by side.
- ``export`` and ``snippet``: the winner as a ``knobtune.best/1`` file, or as lines of code.
- ``dashboard``: optuna-dashboard on a storage.
"""
from __future__ import annotations

# (no name here is also a module's: ``from knobtune.search.story import snippet`` is the module)
from knobtune.search.story.export import best_config, load_existing, study_names
from knobtune.search.story.progress import Progress, rate
from knobtune.search.story.summary import study_summary, trial_line

__all__ = ["Progress", "best_config", "load_existing", "rate", "study_names", "study_summary", "trial_line"]
