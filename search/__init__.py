"""knobtune's engine: study files, Optuna studies, isolated trials, export. Framework-free."""
from __future__ import annotations

from importlib import metadata

try:
    __version__ = metadata.version("knobtune")
except metadata.PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+source"
