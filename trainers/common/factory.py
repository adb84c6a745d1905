"""Importing and calling a user's ``package.module:factory`` (shared by every trainer)."""
from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable

from knobtune.trainers.common.errors import WorkloadError


def import_factory(spec: str) -> Callable[..., Any]:
    """The callable named by ``package.module:factory``, or a WorkloadError saying what is wrong."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise WorkloadError(f"workload {spec!r} is malformed: expected 'package.module:factory'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise WorkloadError(
            f"workload {spec!r}: cannot import module {module_name!r} ({type(exc).__name__}: {exc})"
        ) from None
    factory = getattr(module, attr, None)
    if factory is None:
        raise WorkloadError(f"workload {spec!r}: module {module_name!r} has no attribute {attr!r}")
    if not callable(factory):
        raise WorkloadError(f"workload {spec!r}: {attr!r} is a {type(factory).__name__}, expected a callable factory")
    return factory


def resolve(name: str, builtins: dict[str, Callable[..., Any]], framework: str) -> Callable[..., Any]:
    """The factory of the built-in ``name``, or of the user's ``package.module:factory``."""
    if name in builtins:
        return builtins[name]
    if ":" in name:
        return import_factory(name)
    raise WorkloadError(
        f"unknown {framework} workload {name!r}: expected one of {', '.join(sorted(builtins))} "
        f"or 'package.module:factory'"
    )


def call_factory(factory: Callable[..., Any], label: str, options: dict[str, Any], expected: type,
                 expected_name: str) -> Any:
    """Call ``factory(**options)`` and check it returned an ``expected`` instance."""
    try:
        inspect.signature(factory).bind(**options)
    except TypeError as exc:
        raise WorkloadError(f"workload {label!r} does not take options {sorted(options)}: {exc}") from None
    except ValueError:  # no signature available (a C callable); let the call decide
        pass
    try:
        workload = factory(**options)
    except WorkloadError:
        raise
    except Exception as exc:  # the user's factory failed: their input, reported in one line
        raise WorkloadError(f"workload factory {label!r} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(workload, expected):
        raise WorkloadError(
            f"workload factory {label!r} returned {type(workload).__module__}.{type(workload).__qualname__}, "
            f"expected {expected_name}"
        )
    if getattr(workload, "name", None) == "custom":
        workload.name = label
    return workload


def require_ints(workload: str, least: int = 1, **options: Any) -> None:
    """A WorkloadError naming the first of ``options`` that is not an integer >= ``least``."""
    for name, value in options.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise WorkloadError(f"{workload} option {name} = {value!r}: expected an integer >= {least}")


def check_charlm(context: int, depth: int, width: int, heads: int) -> None:
    """charlm's model options, checked before either framework builds the model."""
    require_ints("charlm", 1, depth=depth, width=width, heads=heads, context=context)
    if width % heads:
        raise WorkloadError(f"charlm options width = {width}, heads = {heads}: expected a width divisible by heads")
