"""The pieces of a PyTorch training loop that the integration API's drivers share: a batch's
samples, its copy on the device (and channels_last), and the device-side NaN/Inf guard."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from knobtune.trainers.common.script import batch_length


def _leading(leaf: Any) -> int | None:
    return int(leaf.shape[0]) if isinstance(leaf, torch.Tensor) and leaf.dim() > 0 else None


def count(batch: Any) -> int:
    """Samples in a batch: its first tensor's batch dimension (tuples, lists, dicts nested)."""
    first = batch[0] if type(batch) in (list, tuple) and batch else batch
    if type(first) is torch.Tensor and first.dim() > 0:  # (the common case, once per step: no walk)
        return first.shape[0]
    return batch_length(batch, _leading)


def to_device(obj: Any, device: torch.device, non_blocking: bool) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
        return type(obj)(*(to_device(o, device, non_blocking) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(o, device, non_blocking) for o in obj)
    if isinstance(obj, Mapping):
        moved = {k: to_device(v, device, non_blocking) for k, v in obj.items()}
        try:
            return type(obj)(moved)
        except TypeError:  # a mapping that cannot be built from a dict
            return moved
    return obj


class LossGuard:
    """The device-side NaN/Inf guard: each micro-batch's loss is copied into a preallocated
    device buffer (one small op, no sync); at a segment boundary the segment's slice is summed
    once (a non-finite value survives the sum) and, only when it is not finite, searched for the
    first bad step. (A Python list of loss tensors costs no device op but measured 1-2 % slower
    on a fast CPU step: hundreds of live tensors lengthen the garbage collector's passes.)"""

    def __init__(self, steps: int, device: torch.device) -> None:
        self.losses = torch.zeros(max(1, steps), dtype=torch.float32, device=device)
        self.slots = self.losses.unbind()  # one view per step, made once (indexing per step costs more)
        self.read_to = 0  # micro-batches before the current segment
        self.seen = 0     # micro-batches recorded so far

    def record(self, i: int, loss: torch.Tensor) -> None:
        self.slots[i % len(self.slots)].copy_(loss.detach())
        self.seen = i + 1

    def read(self) -> tuple[bool, int | None, float | None]:
        """(finite, first bad step, mean loss) of the segment since the last read; after a sync."""
        start, end = self.read_to, self.seen
        self.read_to = end
        if end <= start:
            return True, None, None
        segment = self.losses[start:end] if end <= len(self.losses) else self.losses
        total = float(segment.sum().item())
        if np.isfinite(total):
            return True, None, total / len(segment)
        bad = int((~torch.isfinite(segment)).nonzero()[0, 0].item())
        return False, start + bad if end <= len(self.losses) else None, None


def channels_last(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.contiguous(memory_format=torch.channels_last) if batch.dim() == 4 else batch
    if isinstance(batch, (list, tuple)) and batch and not hasattr(batch, "_fields"):
        # only the inputs (the first element) are images; targets stay as they are
        return type(batch)([channels_last(batch[0]), *batch[1:]])
    return batch


class LoaderView:
    """A DataLoader's settings, read from what a trainer library built around it (accelerate's
    ``DataLoaderShard`` wraps a DataLoader made with a batch sampler: no ``batch_size`` of its
    own)."""

    def __init__(self, loader: Any) -> None:
        base = getattr(loader, "base_dataloader", loader)
        sampler = getattr(base, "batch_sampler", None)
        self.loader = loader
        self.batch_size = getattr(base, "batch_size", None) or getattr(sampler, "batch_size", None)
        self.drop_last = bool(getattr(base, "drop_last", False) if getattr(base, "batch_size", None)
                              else getattr(sampler, "drop_last", False))
        self.num_workers = int(getattr(base, "num_workers", 0) or 0)
        self.pin_memory = bool(getattr(base, "pin_memory", False))
        self.prefetch_factor = getattr(base, "prefetch_factor", None)
        self.persistent_workers = bool(getattr(base, "persistent_workers", False))
        self.in_order = bool(getattr(base, "in_order", True))
        self.grouped_by_length = _samplers_include(base, "LengthGroupedSampler")

    @classmethod
    def of(cls, loader: Any) -> "LoaderView":
        return loader if isinstance(loader, cls) else cls(loader)


def _samplers_include(loader: Any, name: str) -> bool:
    """Whether a sampler of class ``name`` orders ``loader`` (its sampler, its batch sampler's,
    through the wrappers a library adds)."""
    seen = [getattr(loader, "sampler", None), getattr(loader, "batch_sampler", None)]
    for _ in range(4):
        if any(type(s).__name__ == name for s in seen):
            return True
        seen = [inner for s in seen for inner in (getattr(s, "sampler", None), getattr(s, "batch_sampler", None))
                if inner is not None]
    return False


class AutocastSeen:
    """What autocast really did in a model a library runs: the dtype its first matmul layer
    (Linear, a convolution) gave in its first forward; ``fast_dtype`` None when that was fp32.
    The hook removes itself after one call."""

    LAYERS = ("Linear", "Conv1d", "Conv2d", "Conv3d", "Conv1D")

    def __init__(self, model: torch.nn.Module) -> None:
        self.fast_dtype: torch.dtype | None = None
        self.seen = False
        layer = next((m for m in model.modules() if type(m).__name__ in self.LAYERS), None)
        self.handle = layer.register_forward_hook(self._hook) if layer is not None else None

    def _hook(self, module: Any, inputs: Any, output: Any) -> None:
        if isinstance(output, torch.Tensor) and output.is_floating_point():
            self.seen = True
            self.fast_dtype = output.dtype if output.dtype in (torch.bfloat16, torch.float16) else None
            if self.handle is not None:
                self.handle.remove()
