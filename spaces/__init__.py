"""The knobs: names, choices, conditions and the hardware they apply to. Framework-free data."""
from __future__ import annotations

from knobtune.spaces.knobs import Knob, Space

__all__ = ["Knob", "Space", "for_framework", "FRAMEWORKS"]

FRAMEWORKS = ("pytorch", "tensorflow")


def for_framework(framework: str) -> Space:
    """The knob space of ``framework`` ("pytorch" or "tensorflow")."""
    if framework == "pytorch":
        from knobtune.spaces.pytorch import SPACE
    elif framework == "tensorflow":
        from knobtune.spaces.tensorflow import SPACE
    else:
        raise ValueError(f"unknown framework {framework!r}: expected one of {', '.join(FRAMEWORKS)}")
    return SPACE
