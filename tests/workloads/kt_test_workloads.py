"""Test workloads: tiny real digits data, and faults injected on purpose.

The tests put this folder on PYTHONPATH and name these as "kt_test_workloads:<factory>".
"""
from __future__ import annotations

import os
import time

import torch
from torch import nn
from torch.utils.data import Dataset

from knobtune.pytorch import Workload
from knobtune.trainers.common import digits
from knobtune.trainers.pytorch.data import PngDigits
from knobtune.trainers.pytorch.models import mlp


def tiny(train: int = 320, val: int = 160, batch_size: int = 32, build_model=mlp) -> Workload:
    """The digits MLP (or ``build_model``'s model) on a slice of the real PNG files."""
    files = digits.prepare()
    return Workload(
        build_model=build_model,
        train_dataset=PngDigits(files.train[:train], augment=True),
        eval_dataset=PngDigits(files.val[:val], augment=False),
        batch_size=batch_size,
    )


def rmsprop() -> Workload:
    """The tiny digits MLP trained with RMSprop: a foreach implementation, no fused one."""
    workload = tiny()
    workload.build_optimizer = lambda params: torch.optim.RMSprop(params, lr=1e-3)
    return workload


class _Diverging(nn.Module):
    """Finite until a batch of ``bad_batch`` samples arrives (or after ``after`` calls): then inf."""

    def __init__(self, bad_batch: int | None, after: int | None) -> None:
        super().__init__()
        self.net = mlp()
        self.bad_batch, self.after, self.calls = bad_batch, after, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        out = self.net(x)
        if (self.bad_batch is not None and x.shape[0] == self.bad_batch) or (
            self.after is not None and self.calls > self.after
        ):
            out = out * float("inf")
        return out


def diverge(bad_batch: int | None = None, after: int | None = None) -> Workload:
    """Loss turns non-finite for one batch size, or after ``after`` steps."""
    return tiny(build_model=lambda: _Diverging(bad_batch, after))


class _Aborting(nn.Module):
    def __init__(self, batch: int | None) -> None:
        super().__init__()
        self.net, self.batch = mlp(), batch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.batch is None or x.shape[0] == self.batch:
            os.abort()
        return self.net(x)


def abort(batch: int | None = None) -> Workload:
    """The process aborts (SIGABRT) in forward, for every batch or for one batch size."""
    return tiny(build_model=lambda: _Aborting(batch))


class _Sleepy(Dataset):
    def __init__(self, inner: Dataset, seconds: float) -> None:
        self.inner, self.seconds = inner, seconds

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, index: int):
        time.sleep(self.seconds)
        return self.inner[index]


def sleepy(seconds: float = 30.0) -> Workload:
    """Every training sample takes ``seconds`` to load: runs past any short timeout."""
    base = tiny()
    base.train_dataset = _Sleepy(base.train_dataset, seconds)
    return base


def not_a_workload() -> int:
    return 42


def needs_option(size: int) -> Workload:
    return tiny(train=size)


class _Paced(nn.Module):
    """The MLP with artificial costs by batch size: ``step_cost`` seconds per step for the batch
    sizes listed, and ``warmup_cost`` seconds on the first call for others (like a compile)."""

    def __init__(self, slow_batches: tuple[int, ...], step_cost: float, warm_batches: tuple[int, ...],
                 warmup_cost: float) -> None:
        super().__init__()
        self.net = mlp()
        self.slow, self.step_cost, self.warm, self.warmup_cost = slow_batches, step_cost, warm_batches, warmup_cost
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.training and x.shape[0] in self.slow:
            time.sleep(self.step_cost)
        if self.training and self.calls == 1 and x.shape[0] in self.warm:
            time.sleep(self.warmup_cost)
        return self.net(x)


def paced(slow: list[int] | None = None, step_cost: float = 0.0, warm: list[int] | None = None,
          warmup_cost: float = 0.0, train: int = 320) -> Workload:
    return tiny(train=train, build_model=lambda: _Paced(tuple(slow or ()), step_cost, tuple(warm or ()), warmup_cost))


def heavy() -> Workload:
    """Cheap data (in-memory tensors), a wide model: compute-bound."""
    from torch.utils.data import TensorDataset

    generator = torch.Generator().manual_seed(0)
    x = torch.rand(512, 1, 28, 28, generator=generator)
    y = torch.randint(0, 10, (512,), generator=generator)

    def model() -> nn.Module:
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(),
                             nn.Linear(2048, 10))

    return Workload(build_model=model, train_dataset=TensorDataset(x, y), eval_dataset=TensorDataset(x[:64], y[:64]),
                    batch_size=32)


class _Warm(nn.Module):
    """The MLP, with ``warmup_cost`` seconds on its first training call (like a compilation)."""

    def __init__(self, warmup_cost: float) -> None:
        super().__init__()
        self.net, self.warmup_cost, self.calls = mlp(), warmup_cost, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.training and self.calls == 1 and self.warmup_cost:
            time.sleep(self.warmup_cost)
        return self.net(x)


def slow_input(per_sample: float = 0.002, warmup_cost: float = 0.0, batch_size: int = 16,
               train: int = 1437) -> Workload:
    """Input-bound: every training sample takes ``per_sample`` seconds to load (a sleep, so the
    rate is set by the workers, not by this machine's load); an optional slow first step."""
    base = tiny(train=train, batch_size=batch_size, build_model=lambda: _Warm(warmup_cost))
    base.train_dataset = _Sleepy(base.train_dataset, per_sample)
    return base


class _OomIn(nn.Module):
    """Raises MemoryError (what an allocation failure raises) in evaluation, or when moved."""

    def __init__(self, where: str) -> None:
        super().__init__()
        self.net, self.where = mlp(), where

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.where == "eval" and not self.training:
            raise MemoryError("simulated allocation failure in evaluation")
        return self.net(x)

    def to(self, *args, **kwargs):  # type: ignore[override]
        if self.where == "build":
            raise torch.OutOfMemoryError("simulated: CUDA out of memory while moving the model")
        return super().to(*args, **kwargs)


def oom_in(where: str = "eval") -> Workload:
    """Runs out of memory while evaluating (``eval``) or while the model moves to the device (``build``)."""
    return tiny(build_model=lambda: _OomIn(where))


class _KilledWorker(Dataset):
    def __init__(self, inner: Dataset) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, index: int):
        from torch.utils.data import get_worker_info

        if get_worker_info() is not None:  # in a DataLoader worker: die as the OOM killer kills
            os.kill(os.getpid(), 9)
        return self.inner[index]


def worker_killed() -> Workload:
    """Every DataLoader worker is killed by SIGKILL on its first sample (what the kernel's OOM killer does)."""
    base = tiny()
    base.train_dataset = _KilledWorker(base.train_dataset)
    return base


def slow_exit(seconds: float = 120.0) -> Workload:
    """Trains normally; its process then takes ``seconds`` to exit (a slow teardown)."""
    import atexit

    atexit.register(time.sleep, seconds)
    return tiny()


class _GraphBreak(nn.Module):
    """The MLP with a graph break in the middle of forward (torch.compile splits the graph)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * 1.0
        torch._dynamo.graph_break()
        return self.net(x)


def graph_break() -> Workload:
    return tiny(build_model=_GraphBreak)


class _Loud(nn.Module):
    def __init__(self, gain: float) -> None:
        super().__init__()
        self.net, self.gain = mlp(), gain

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x) * self.gain


def loud(gain: float = 1e4) -> Workload:
    """The MLP with its logits multiplied by ``gain``: under fp16 loss scaling the backward overflows."""
    return tiny(build_model=lambda: _Loud(gain))


class _EvalLimit(nn.Module):
    def __init__(self, limit: int) -> None:
        super().__init__()
        self.net, self.limit = mlp(), limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training and x.shape[0] > self.limit:
            raise ValueError(f"evaluation batch of {x.shape[0]} is over {self.limit}")
        return self.net(x)


def eval_limit(limit: int = 16) -> Workload:
    """A model that refuses evaluation batches larger than ``limit``."""
    return tiny(build_model=lambda: _EvalLimit(limit))


class DictDigits(Dataset):
    """Samples as dicts (Hugging Face style): {'pixels': image, 'label': class}."""

    def __init__(self, base: Dataset) -> None:
        self.base = base

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x, y = self.base[i]
        return {"pixels": x, "label": torch.tensor(y)}


def dict_batches() -> Workload:
    """The tiny digits as dict samples (Hugging Face style), which the built-in loop cannot unpack."""
    base = tiny()
    return Workload(build_model=mlp, train_dataset=DictDigits(base.train_dataset),
                    eval_dataset=DictDigits(base.eval_dataset), batch_size=16)
