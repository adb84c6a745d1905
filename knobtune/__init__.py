"""knobtune: find the fastest safe way to train a given model on a given machine.

One import name. The public faces are ``knobtune.pytorch`` and ``knobtune.tensorflow`` (``Tuned``
for your own training script, ``Workload`` for the built-in loop); the console command is
``knobtune`` (``python -m knobtune``). Beneath them, installed from the repository's top-level
folders: ``knobtune.search`` (the framework-free engine), ``knobtune.spaces`` (the knobs) and
``knobtune.trainers`` (the trial children, one sub-package per framework).
"""
from __future__ import annotations

from importlib import metadata

try:
    __version__ = metadata.version("knobtune")
except metadata.PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+source"

__all__ = ["__version__"]
