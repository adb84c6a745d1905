"""One PyTorch trial's child: the built-in training loop over a ``Workload``, or the user's own
script, both through the integration API (trainers/pytorch/tuned.py), which applies the knobs,
times the burst and guards it."""
from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader

from knobtune.trainers.common.errors import WorkloadError
from knobtune.trainers.common.tuned import run_request
from knobtune.trainers.common.wire import Request, Result
from knobtune.trainers.pytorch import distributed, group
from knobtune.trainers.pytorch.faults import oom_reason
from knobtune.trainers.pytorch.loops import to_device
from knobtune.trainers.pytorch.tuned import Tuned, for_request
from knobtune.trainers.pytorch.workload import Workload, accuracy, load


def pair(batch: Any, name: str) -> tuple[Any, Any]:
    """A Workload's batch as (inputs, targets), or one line saying what it is instead."""
    if isinstance(batch, (list, tuple)) and len(batch) == 2:
        return batch[0], batch[1]
    kind = f"dict batches (keys {', '.join(map(str, batch))})" if isinstance(batch, dict) else \
        f"batches of type {type(batch).__name__}"
    raise WorkloadError(f"workload {name!r} yields {kind}: a Workload trains on (inputs, targets) pairs; give it "
                        f"a collate_fn that returns one, or tune your own loop with the Tuned API ([study] script)")


@torch.no_grad()
def evaluate(workload: Workload, model: torch.nn.Module, device: torch.device, batch_size: int) -> float:
    """Score the held-out split with the trained weights: eager, fp32, no augmentation, in
    batches of ``batch_size``. The default metric (top-1 over the last axis, per element) is
    counted on the device; a custom metric gets all outputs, gathered on the host."""
    model.eval()
    loader = DataLoader(workload.eval_dataset, batch_size=batch_size, shuffle=False, collate_fn=workload.collate_fn)
    streaming = workload.metric is accuracy
    correct = torch.zeros((), dtype=torch.long, device=device)
    seen = 0
    outputs, targets = [], []
    for batch in loader:
        inputs, target = pair(batch, workload.name)
        out = model(to_device(inputs, device, False))
        if streaming:
            correct += (out.argmax(dim=-1) == to_device(target, device, False)).sum()
            seen += target.numel()
        else:
            outputs.append(out.float().cpu())
            targets.append(target)
    if streaming:
        return int(correct.item()) / max(1, seen)
    return float(workload.metric(torch.cat(outputs), torch.cat(targets)))



def train(workload: Workload) -> None:
    """The built-in training loop: a user of the integration API like any script."""
    kt = Tuned.load()
    loader = kt.dataloader(workload.train_dataset, shuffle=True, batch_size=workload.batch_size,
                           collate_fn=workload.collate_fn)
    model = workload.build_model()
    trained, optimizer = kt.prepare(model, workload.build_optimizer(model.parameters()))
    eval_batch = int(workload.eval_batch_size or loader.batch_size or 64)

    def score() -> float:
        return evaluate(workload, model, kt.device, eval_batch)

    for batch in kt.batches(loader, evaluate=score):
        inputs, targets = pair(batch, workload.name)
        with kt.autocast():
            loss = workload.loss_fn(trained(inputs), targets)
        kt.backward(loss, optimizer)
    kt.report(val_accuracy=score() if distributed.rank() == 0 else None, eval_batch_size=eval_batch)  # rank 0 evaluates


def run(request: Request, role: str = "trial") -> Result:
    """The request's result: the built-in loop over its workload, or its ``script`` run with
    ``args`` (trainers.common.tuned.run_request); an out-of-memory failure is outcome oom. A
    data-parallel request (``nproc`` > 1) runs in a group of ranks (trainers/pytorch/group.py)."""
    if request.nproc > 1 and not distributed.active():
        return group.run(request, role, run)
    return run_request(request, role, for_request,
                       lambda r: train(load(r.workload, r.workload_options)),
                       lambda exc, kt: oom_reason(exc, kt.worker_exit_codes()))  # type: ignore[attr-defined]
