"""What a PyTorch trial trains: the Workload contract, the built-ins, and user factories."""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
from torch import nn
from torch.utils.data import Dataset

from trainers.common.errors import WorkloadError


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> float:
    """Top-1 accuracy of logits against integer class targets."""
    return (outputs.argmax(dim=1) == targets).float().mean().item()


def adam(lr: float = 1e-3) -> Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]:
    def build(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.Adam(params, lr=lr)

    return build


@dataclass
class Workload:
    """A training job knobtune can tune.

    ``train_dataset`` and ``eval_dataset`` yield ``(input, target)`` pairs (or whatever
    ``collate_fn`` turns into an ``(inputs, targets)`` pair of tensors). ``metric(outputs,
    targets)`` scores the whole held-out set in [0, 1] (default: top-1 accuracy).
    ``batch_size`` is the batch the job uses today (the baseline's, unless ``[baseline]`` says).
    """

    build_model: Callable[[], nn.Module]
    train_dataset: Dataset
    eval_dataset: Dataset
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = field(default_factory=nn.CrossEntropyLoss)
    build_optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] = field(default_factory=adam)
    collate_fn: Callable[[list[Any]], Any] | None = None
    metric: Callable[[torch.Tensor, torch.Tensor], float] = accuracy
    batch_size: int = 64
    name: str = "custom"


def _builtins() -> dict[str, Callable[..., Workload]]:
    from trainers.pytorch import builtin

    return builtin.WORKLOADS


def builtin_names() -> list[str]:
    return sorted(_builtins())


def load(name: str, options: dict[str, Any] | None = None) -> Workload:
    """Build the workload called ``name``: a built-in, or ``package.module:factory``."""
    options = dict(options or {})
    builtins = _builtins()
    if name in builtins:
        factory, label = builtins[name], name
    elif ":" in name:
        factory, label = _import_factory(name), name
    else:
        raise WorkloadError(
            f"unknown pytorch workload {name!r}: expected one of {', '.join(sorted(builtins))} "
            f"or 'package.module:factory'"
        )
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
    if not isinstance(workload, Workload):
        raise WorkloadError(
            f"workload factory {label!r} returned {type(workload).__module__}.{type(workload).__qualname__}, "
            f"expected trainers.pytorch.Workload"
        )
    if workload.name == "custom":
        workload.name = label
    return workload


def _import_factory(spec: str) -> Callable[..., Workload]:
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
