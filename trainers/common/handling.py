"""How a trial's child (and production) applies and reads back the knobs that act on their own.

A knob's declaration (name, choices, gating, the call that applies it, its check and its snippet
lines) is in ``spaces/<framework>.py``, which the engine imports and which never imports a
framework. What touches the framework is here, keyed by the same names, in
``trainers/<framework>/knobs.py``: each knob's ``Handling`` (``environ`` before the framework
starts, ``apply`` after the check, ``read`` from the objects trained with). ``Handlers`` checks at
import that it names only the space's knobs, and applies and reads them in the space's order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Collection, Mapping

from knobtune.spaces.knobs import Space

UNREAD: Any = type("Unread", (), {"__repr__": lambda self: "UNREAD"})()  # read back from nothing built


@dataclass(frozen=True)
class Handling:
    """``environ(value, objects)`` and ``apply(value, objects)`` return why the value could not be
    applied, or None; ``read(objects)`` is the value the framework's objects report (``UNREAD``:
    none to ask). ``objects`` is the framework's ``Trained``."""

    environ: Callable[[Any, Any], str | None] | None = None
    apply: Callable[[Any, Any], str | None] | None = None
    read: Callable[[Any], Any] = lambda objects: UNREAD


class Handlers:
    """A framework's knobs as its child handles them."""

    def __init__(self, space: Space, handling: Mapping[str, Handling]) -> None:
        unknown = sorted(set(handling) - set(space.names))
        if unknown:
            raise ValueError(f"handling for knobs {space.framework} does not have: {unknown}; "
                             f"expected some of {space.names}")
        self.space = space
        self.handling = [(name, handling[name]) for name in space.names if name in handling]

    def apply(self, values: Mapping[str, Any], wanted: Collection[str], objects: Any,
              *, environ: bool = False) -> dict[str, str]:
        """Apply each ``wanted`` knob that applies itself, in declaration order: its ``environ``
        (before the framework starts) or its ``apply``. Knob -> why its value was not applied."""
        out: dict[str, str] = {}
        for name, handling in self.handling:
            step = handling.environ if environ else handling.apply
            if step is not None and name in wanted:
                why = step(values[name], objects)
                if why:
                    out[name] = why
        return out

    def read_back(self, objects: Any, skipped: Collection[str] = ()) -> dict[str, Any]:
        """Every knob, but those ``skipped``, as the framework's ``objects`` report it."""
        out: dict[str, Any] = {}
        for name, handling in self.handling:
            value = UNREAD if name in skipped else handling.read(objects)
            if value is not UNREAD:
                out[name] = value
        return out
