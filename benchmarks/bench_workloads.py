"""Workloads the benchmarks measure with (imported by trial children from this folder)."""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from knobtune.pytorch import Workload


def fast_step(samples: int = 8192, hidden: int = 64) -> Workload:
    """A step as short as a CPU step gets: in-memory tensors (no decoding), a 784-64-10 MLP.
    Whatever the tool adds per step shows here first."""
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(samples, 1, 28, 28, generator=generator)
    y = torch.randint(0, 10, (samples,), generator=generator)

    def model() -> nn.Module:
        return nn.Sequential(nn.Flatten(), nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    return Workload(build_model=model, train_dataset=TensorDataset(x, y),
                    eval_dataset=TensorDataset(x[:512], y[:512]), batch_size=64)
