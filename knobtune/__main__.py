"""``python -m knobtune``: the same as the ``knobtune`` command."""
from __future__ import annotations

import sys

from knobtune.search.cli import main

if __name__ == "__main__":
    sys.exit(main())
