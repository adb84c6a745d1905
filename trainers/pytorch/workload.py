"""What a PyTorch trial trains: the Workload contract, the built-ins, and user factories."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
from torch import nn
from torch.utils.data import Dataset

from knobtune.trainers.common.factory import call_factory, resolve


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> float:
    """Top-1 accuracy of logits (classes on the last axis) against integer targets, counted per
    element: per sample for a classifier, per position for a sequence model."""
    return (outputs.argmax(dim=-1) == targets).float().mean().item()


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
    ``eval_batch_size`` bounds the held-out evaluation's batches (default: the trial's batch size).
    """

    build_model: Callable[[], nn.Module]
    train_dataset: Dataset
    eval_dataset: Dataset
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = field(default_factory=nn.CrossEntropyLoss)
    build_optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] = field(default_factory=adam)
    collate_fn: Callable[[list[Any]], Any] | None = None
    metric: Callable[[torch.Tensor, torch.Tensor], float] = accuracy
    batch_size: int = 64
    eval_batch_size: int | None = None
    name: str = "custom"


def _builtins() -> dict[str, Callable[..., Workload]]:
    from knobtune.trainers.pytorch import builtin

    return builtin.WORKLOADS


def load(name: str, options: dict[str, Any] | None = None) -> Workload:
    """Build the workload called ``name``: a built-in, or ``package.module:factory``."""
    factory = resolve(name, _builtins(), "pytorch")
    return call_factory(factory, name, options or {}, Workload, "knobtune.pytorch.Workload")
