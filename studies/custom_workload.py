"""An example user workload: your own model, data, loss, optimizer and metric.

knobtune imports ``studies.custom_workload:build`` from the directory you run it in (here the
repository root) and calls ``build(**[workload] options)``. It must return a
``knobtune.pytorch.Workload``; everything else about the trial (DataLoader, AMP, compile,
accumulation, timing, the NaN guard, evaluation) is knobtune's.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from knobtune.pytorch import Workload


def _digits_tensors(hidden_noise: float) -> tuple[TensorDataset, TensorDataset]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0  # (N, 1, 8, 8) in [0, 1]
    y = torch.tensor(digits.target, dtype=torch.long)
    train_idx, val_idx = train_test_split(range(len(y)), test_size=0.2, random_state=0, stratify=digits.target)
    noisy = x[train_idx] + hidden_noise * torch.randn_like(x[train_idx])
    return TensorDataset(noisy, y[train_idx]), TensorDataset(x[val_idx], y[val_idx])


def build(width: int = 128, lr: float = 0.05, noise: float = 0.05) -> Workload:
    """A 64-width-10 MLP on the 8x8 digits as in-memory tensors, trained with SGD + momentum."""
    train, val = _digits_tensors(noise)

    def model() -> nn.Module:
        return nn.Sequential(nn.Flatten(), nn.Linear(64, width), nn.ReLU(), nn.Linear(width, 10))

    def optimizer(params):
        return torch.optim.SGD(params, lr=lr, momentum=0.9)

    def top1(outputs: torch.Tensor, targets: torch.Tensor) -> float:
        return (outputs.argmax(1) == targets).float().mean().item()

    return Workload(
        build_model=model,
        train_dataset=train,
        eval_dataset=val,
        loss_fn=nn.CrossEntropyLoss(label_smoothing=0.05),
        build_optimizer=optimizer,
        metric=top1,
        batch_size=32,
        name="custom-digits-8x8",
    )
