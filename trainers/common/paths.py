"""Where knobtune keeps prepared data."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The data cache: $KNOBTUNE_CACHE_DIR, else $XDG_CACHE_HOME/knobtune, else ~/.cache/knobtune."""
    explicit = os.environ.get("KNOBTUNE_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "knobtune"
