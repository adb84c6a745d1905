"""Looks inside a PyTorch trial's machinery in a child process (the tests never import torch):
``python -m kt_inspect augment|guard_ops``, one JSON line on stdout."""
from __future__ import annotations

import json
import sys
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from knobtune.spaces import for_framework
from knobtune.trainers.common.wire import Burst, Request
from knobtune.trainers.pytorch.loops import LossGuard
from knobtune.trainers.pytorch.tuned import Tuned, for_request
from knobtune.trainers.pytorch.workload import load

BURST = Burst(train_samples=2048, warmup_samples=64, windows=3)


def knobs(**overrides: Any) -> dict[str, Any]:
    """Every PyTorch knob at its CPU default (batch 32), then ``overrides``."""
    ctx = {"hardware": {"cuda": False, "bf16": True, "usable_cores": 2}, "workload": {"batch_size": 32}}
    return {**for_framework("pytorch").defaults(ctx), **overrides}


def augment() -> dict[str, Any]:
    """The first batches of the augmented training stream with 0 and with 2 workers (and another seed)."""
    workload = load("kt_test_workloads:tiny")

    def first(workers: int, seed: int) -> list[torch.Tensor]:
        extra = {"persistent_workers": True} if workers else {}
        kt = for_request(Request(knobs=knobs(num_workers=workers, **extra), burst=BURST, seed=seed))
        loader = kt.dataloader(workload.train_dataset, shuffle=True, collate_fn=workload.collate_fn)
        out = []
        for epoch in range(2):  # two epochs: the stream goes on identically across epochs
            for i, (x, _) in enumerate(loader):
                if i == 3:
                    break
                out.append(x)
        return out

    zero, two, other = first(0, 0), first(2, 0), first(0, 1)
    return {"same_with_workers": all(torch.equal(a, b) for a, b in zip(zero, two)),
            "batches": len(zero),
            "epochs_differ": not torch.equal(zero[0], zero[3]),
            "other_seed_differs": not torch.equal(zero[0], other[0])}


class CountOps(TorchDispatchMode):
    """Counts the aten ops that do work (views and detach are metadata only)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if not func.is_view and func.__name__.split(".")[0] not in ("detach", "alias"):
            self.count += 1
        return func(*args, **(kwargs or {}))


def trainer(guard: bool) -> tuple[Tuned, Any]:
    """A trial's API over the tiny workload, and a step function ``step(i, inputs, targets)``."""
    workload = load("kt_test_workloads:tiny")
    kt = for_request(Request(knobs=knobs(), burst=BURST, guard=guard))
    model = workload.build_model()
    trained, optimizer = kt.prepare(model, workload.build_optimizer(model.parameters()))
    kt.guard = LossGuard(1000, kt.device)

    def step(i: int, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        kt.step_index = i
        with kt.autocast():
            loss = workload.loss_fn(trained(inputs), targets)
        kt.backward(loss, optimizer)

    return kt, step


def guard_ops() -> dict[str, Any]:
    """Ops per training step with the NaN guard on and off (the same batch, 20 steps each)."""
    counts = {}
    workload = load("kt_test_workloads:tiny")
    inputs, targets = next(iter(torch.utils.data.DataLoader(workload.train_dataset, batch_size=32)))
    for guard in (True, False):
        kt, step = trainer(guard)
        step(0, inputs, targets)  # optimizer state created outside the count
        with CountOps() as mode:
            for i in range(1, 21):
                step(i, inputs, targets)
        counts[guard] = mode.count / 20
        reading = kt.driver.checkpoint()
        kt.close()
        if guard:
            finite, mean_loss = reading.finite, reading.mean_loss
    return {"per_step_guard_on": counts[True], "per_step_guard_off": counts[False],
            "finite": finite, "mean_loss": mean_loss}


if __name__ == "__main__":
    print(json.dumps({"augment": augment, "guard_ops": guard_ops}[sys.argv[1]]()))
