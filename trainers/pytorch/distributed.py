"""Data-parallel training inside one rank: a rank of a trial's group (trainers/pytorch/group.py) or
of a production job under ``torchrun``, told apart from a single process by torchrun's environment
(``WORLD_SIZE`` above 1). ``kt.prepare`` wraps the model in ``DistributedDataParallel`` with the
trial's (or the export's) DDP knobs, starting the process group when the script has not; the
training loader reads its rank's shard; the NaN guard is read from every rank at each boundary.
"""
from __future__ import annotations

import inspect
import os
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from knobtune.trainers.common.errors import WorkloadError

# ddp_comm_hook -> the hook's name in torch.distributed.algorithms.ddp_comm_hooks.default_hooks
COMM_HOOKS = {"fp16": "fp16_compress_hook", "bf16": "bf16_compress_hook"}
# torch >= 2.12 names broadcast_buffers forward_sync_buffers (and warns on the old name)
_BUFFERS = ("forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
            else "broadcast_buffers")


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def active() -> bool:
    """Whether this process is one rank of several (torchrun's environment, or a trial's group)."""
    return world_size() > 1


def rank() -> int:
    return int(os.environ.get("RANK", "0") or 0)


def device() -> torch.device:
    """The device this process trains on: its ``LOCAL_RANK``'s GPU in a group on a GPU box."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    if not active():
        return torch.device("cuda")
    index = int(os.environ.get("LOCAL_RANK", "0") or 0)
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def backend(on: torch.device) -> str:
    return "nccl" if on.type == "cuda" else "gloo"


def _available(on: torch.device) -> str:
    """The backend for ``on``; WorkloadError when this torch does not have it."""
    name = backend(on)
    if not dist.is_backend_available(name):
        raise WorkloadError(f"a data-parallel run on {on.type} needs torch.distributed's {name} backend, which this "
                            f"torch does not have")
    return name


def start(on: torch.device) -> None:
    """Join the process group (torchrun's env:// rendezvous) unless the script already did."""
    if not dist.is_initialized():
        dist.init_process_group(_available(on), device_id=on if on.type == "cuda" else None)


def _hook(name: str) -> Callable[..., Any]:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return getattr(default_hooks, COMM_HOOKS[name])


def wrap(module: torch.nn.Module, knobs: dict[str, Any], on: torch.device) -> DistributedDataParallel:
    """``module`` in ``DistributedDataParallel`` with the DDP knobs; the process group started first."""
    start(on)
    ddp = DistributedDataParallel(
        module, device_ids=[on.index] if on.type == "cuda" else None,
        bucket_cap_mb=float(knobs["ddp_bucket_cap_mb"]),
        gradient_as_bucket_view=bool(knobs["ddp_gradient_as_bucket_view"]),
        static_graph=bool(knobs["ddp_static_graph"]),
        **{_BUFFERS: bool(knobs["ddp_broadcast_buffers"])})
    if knobs["ddp_comm_hook"] != "none":
        ddp.register_comm_hook(None, _hook(knobs["ddp_comm_hook"]))
    return ddp


def read_back(ddp: DistributedDataParallel) -> dict[str, Any]:
    """The DDP knobs as the wrapped model reports them."""
    hook = ddp._get_ddp_logging_data().get("comm_hook") or ""
    cap = ddp.bucket_bytes_cap / (1024 * 1024)
    return {"ddp_bucket_cap_mb": int(cap) if cap == int(cap) else cap,
            "ddp_gradient_as_bucket_view": bool(ddp.gradient_as_bucket_view),
            "ddp_static_graph": bool(ddp.static_graph),
            "ddp_broadcast_buffers": bool(getattr(ddp, _BUFFERS)),
            "ddp_comm_hook": next((k for k, v in COMM_HOOKS.items() if v == hook), "none")}


def capabilities(on: torch.device) -> dict[str, Any]:
    """What a data-parallel trial can use here (the probe asks): the backend, and the
    communication hooks it accepts, tried on a one-rank group of a tiny model. Raises
    WorkloadError when the backend cannot start."""
    name = _available(on)
    started = not dist.is_initialized()
    if started:
        dist.init_process_group(name, store=dist.HashStore(), rank=0, world_size=1)
    try:
        hooks = ["none"]
        for hook in COMM_HOOKS:
            ddp = DistributedDataParallel(torch.nn.Linear(2, 2).to(on), device_ids=[on.index] if on.index else None)
            try:
                ddp.register_comm_hook(None, _hook(hook))
                ddp(torch.ones(1, 2, device=on)).sum().backward()
                hooks.append(hook)
            except (TypeError, RuntimeError, ValueError):  # e.g. bf16 compression needs NCCL 2.10+
                pass
        return {"backend": name, "comm_hooks": hooks}
    finally:
        if started:
            dist.destroy_process_group()


def gathered(value: Any) -> list[Any]:
    """``value`` from every rank, in rank order (a collective: every rank calls it at the same point)."""
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, value)
    return out
