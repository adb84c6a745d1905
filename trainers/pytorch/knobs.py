"""Applying PyTorch's knobs that a call applies together, for real, whoever trains: the
DataLoader's arguments, the model's preparation (device, channels_last, torch.compile),
autocast, the optimizer's implementation and the fp16 optimizer; and checking which values this
machine can apply. A knob applied on its own (threads, cuDNN, matmul precision, the CUDA caching
allocator) is applied, and every knob read back, by its definition in spaces/pytorch.py."""
from __future__ import annotations

import inspect
import os
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Mapping

import torch
from torch.utils.data import DataLoader

from knobtune.spaces.pytorch import ALLOC_CONF, DDP_KNOBS, SPACE
from knobtune.trainers.common import hostinfo
from knobtune.trainers.common.errors import InvalidKnobs
from knobtune.trainers.common.handling import UNREAD, Handlers, Handling

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
LOADER_KNOBS = SPACE.applied_by("dataloader")
# the DataLoader argument of a loader knob whose name is not the argument's
LOADER_ARGUMENTS = {"dataloader_in_order": "in_order"}
OPTIMIZER_IMPLS = ("default", "foreach", "fused")
# Optimizers with a fused CUDA implementation that takes GradScaler's scale and found_inf on the
# device (``_step_supports_amp_scaling``): with them fp16 needs no host read per step.
FUSABLE = (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD)
# What each knob is when nobody set it: PyTorch's own defaults (batch_size: the script's).
DEFAULTS: dict[str, Any] = {k.name: k.default for k in SPACE.knobs if k.name != "batch_size"}


def check(knobs: dict[str, Any], device: torch.device) -> None:
    """Raise InvalidKnobs for a value or combination this device cannot train with."""
    found = {k: v for k, v in problems(knobs, device).items() if k != "pin_memory"}  # torch ignores that one
    if found:
        raise InvalidKnobs(next(iter(found.values())))


def problems(knobs: dict[str, Any], device: torch.device) -> dict[str, str]:
    """Knob -> why this device cannot apply its value (empty when all apply): each knob's
    ``check`` and ``problem`` (spaces/pytorch.py) on this device's facts."""
    from knobtune.trainers.pytorch import env

    return SPACE.problems(knobs, {**env.hardware(cuda=device.type == "cuda"), "torch": torch.__version__})


def loader_in_order() -> bool:
    """Whether this torch's DataLoader takes ``in_order`` (torch 2.6 and newer)."""
    return "in_order" in inspect.signature(DataLoader.__init__).parameters


def read_ahead(knobs: dict[str, Any]) -> int:
    """Batches a DataLoader holds ready at most: every worker's prefetch_factor batches."""
    workers = int(knobs.get("num_workers") or 0)
    return workers * int(knobs.get("prefetch_factor") or 2) if workers > 0 else 0


def loader_arguments(knobs: dict[str, Any]) -> dict[str, Any]:
    """The DataLoader arguments the knobs set (worker options only with workers, as torch requires)."""
    workers = int(knobs.get("num_workers") or 0)
    out: dict[str, Any] = {"num_workers": workers, "pin_memory": bool(knobs.get("pin_memory", False))}
    if knobs.get("batch_size") is not None:
        out["batch_size"] = int(knobs["batch_size"])
    if workers > 0:
        out["prefetch_factor"] = int(knobs.get("prefetch_factor") or 2)
        out["persistent_workers"] = bool(knobs.get("persistent_workers", False))
        if knobs.get("dataloader_in_order") is False:  # (only then: torch's default needs no argument)
            out["in_order"] = False
    return out


def loader_report(loader: Any) -> dict[str, Any]:
    """The DataLoader's settings, read back from the object that was built."""
    return {
        "batch_size": loader.batch_size,
        "num_workers": loader.num_workers,
        "pin_memory": loader.pin_memory,
        "prefetch_factor": loader.prefetch_factor,
        "persistent_workers": loader.persistent_workers,
        "drop_last": loader.drop_last,
    }


def ready_batches(iterator: Any) -> int | None:
    """Batches a multi-process DataLoader iterator holds loaded and not yet handed out (its
    result queues and its reorder buffer); None when this torch does not let us count them."""
    try:
        queues = {id(q): q for q in (iterator._worker_result_queue, iterator._data_queue)}
        queued = sum(q.qsize() for q in queues.values())
        reordered = sum(1 for info in iterator._task_info.values() if len(info) == 2)
    except (AttributeError, NotImplementedError, OSError):
        return None
    return queued + reordered


def prepare_model(model: torch.nn.Module, knobs: dict[str, Any], device: torch.device,
                  wrap: Callable[[torch.nn.Module], torch.nn.Module] | None = None) -> torch.nn.Module:
    """Move ``model`` to the device (in place; channels_last when asked) and return the module to
    train with: ``model`` itself, ``wrap(model)`` (DistributedDataParallel in a data-parallel
    rank), or its ``torch.compile`` wrapper (which shares its parameters; DDP is compiled whole)."""
    model.to(device)
    if knobs.get("channels_last"):
        model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    if wrap is not None:
        model = wrap(model)
    mode = knobs.get("compile", "off")
    if mode == "off":
        return model
    # static shapes, as measured: a last partial batch in production then compiles a second graph
    # once, instead of switching every step to slower dynamic-shape kernels
    return torch.compile(model, mode=None if mode == "default" else mode, dynamic=False)  # type: ignore[return-value]


def has_conv(model: torch.nn.Module) -> bool:
    return any(isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)) for m in model.modules())


def autocast(knobs: dict[str, Any], device: torch.device) -> ContextManager[Any]:
    amp = knobs.get("amp", "off")
    return torch.autocast(device_type=device.type, dtype=AMP_DTYPES[amp]) if amp != "off" else nullcontext()


def _params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _impl_flags(optimizer_class: type, impl: str) -> dict[str, Any]:
    """The constructor flags that select ``impl`` (only those the class takes)."""
    flags = {"foreach": impl == "foreach" or None, "fused": impl == "fused" or None}
    accepted = inspect.signature(optimizer_class.__init__).parameters
    return {k: v for k, v in flags.items() if k in accepted}


def _options(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's defaults its constructor takes (defaults can hold keys it does not take:
    AdamW's decoupled_weight_decay)."""
    accepted = inspect.signature(type(optimizer).__init__).parameters
    return {k: v for k, v in optimizer.defaults.items() if k in accepted}


def _twin(optimizer: torch.optim.Optimizer, impl: str) -> torch.optim.Optimizer:
    """The same optimizer class over the same param groups, options and state, with ``impl``."""
    flags = _impl_flags(type(optimizer), impl)
    groups = [{**group, **flags} for group in optimizer.param_groups]
    twin = type(optimizer)(groups, **{**_options(optimizer), **flags})
    twin.load_state_dict(optimizer.state_dict())  # momentum and the like, when training resumes
    for group in twin.param_groups:  # load_state_dict brought back the saved groups' own flags
        group.update(flags)
    return twin


def impl_problem(optimizer: torch.optim.Optimizer, impl: str, device: torch.device) -> str | None:
    """Why ``optimizer`` cannot step with ``impl`` on ``device`` (None: it can), tried for real:
    its class, options and parameter dtype, with ``impl``, step a small tensor on ``device``."""
    if impl == "default":
        return None
    name = type(optimizer).__name__
    if impl not in OPTIMIZER_IMPLS:
        return f"optimizer_impl={impl!r}: expected one of {', '.join(OPTIMIZER_IMPLS)}"
    if impl not in inspect.signature(type(optimizer).__init__).parameters:
        return f"optimizer_impl={impl!r}: {name} has no {impl} implementation"
    params = _params(optimizer)
    dtype = params[0].dtype if params else torch.float32
    probe = torch.zeros(2, dtype=dtype, device=device, requires_grad=True)
    probe.grad = torch.zeros_like(probe)
    try:
        type(optimizer)([probe], **{**_options(optimizer), **_impl_flags(type(optimizer), impl)}).step()
    except (RuntimeError, ValueError, TypeError) as exc:
        return f"optimizer_impl={impl!r}: {name} cannot run it here ({str(exc).splitlines()[0]})"
    return None


def optimizer_impls(optimizer: torch.optim.Optimizer | None, device: torch.device) -> dict[str, Any]:
    """The probe's description of an optimizer: its class and the implementations it can step
    with on ``device`` (``default`` always)."""
    if optimizer is None:
        return {"optimizer": None, "optimizer_impls": ["default"]}
    impls = [impl for impl in OPTIMIZER_IMPLS if impl_problem(optimizer, impl, device) is None]
    return {"optimizer": type(optimizer).__name__, "optimizer_impls": impls}


def with_impl(optimizer: torch.optim.Optimizer, impl: str) -> torch.optim.Optimizer:
    """``optimizer`` rebuilt with ``foreach=True`` or ``fused=True`` (itself for ``default``)."""
    return optimizer if impl == "default" else _twin(optimizer, impl)


def fused(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer | None:
    """The same optimizer with ``fused=True``, or None when it has no fused CUDA implementation."""
    if type(optimizer) not in FUSABLE or optimizer.defaults.get("fused") or optimizer.defaults.get("differentiable"):
        return None
    params = _params(optimizer)
    if not params or not all(p.is_cuda and p.is_floating_point() for p in params):
        return None
    try:
        return _twin(optimizer, "fused")
    except (RuntimeError, ValueError, TypeError, KeyError):
        return None


def per_step_sync(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer | None) -> str | None:
    """Why training syncs the host with the device every step (None: it does not)."""
    if scaler.is_enabled() and optimizer is not None and not getattr(optimizer, "_step_supports_amp_scaling", False):
        return (f"fp16: GradScaler reads found_inf on the host every step ({type(optimizer).__name__} "
                f"has no fused implementation that takes it on the device)")
    return None


def memory_limit_mb(device: torch.device) -> float | None:
    """What the peak is judged against: the GPU's memory, or the host memory this process may
    grow into on a CPU (trainers/common/hostinfo.memory_room_mb)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory / 2**20
    return hostinfo.memory_room_mb()


def peak_memory_mb(device: torch.device) -> float:
    import resource

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


# ----------------------------------------------------------------- applied on their own, read back
# Each knob's child side (its declaration: spaces/pytorch.py): how a knob that acts on its own is
# applied, and how every knob is read back from what the trial trained with.


@dataclass(frozen=True)
class Trained:
    """What a PyTorch child applied the knobs to, as their ``environ``, ``apply`` and ``read`` see
    it (torch objects typed Any: the engine imports this module, never torch)."""

    device: Any
    knobs: Mapping[str, Any]  # as requested, the framework defaults where none was
    loader: Any = None        # the DataLoader trained on (None: none, or not a DataLoader)
    models: tuple[Any, ...] = ()
    optimizer: Any = None
    autocast: Any = None
    compile_report: Mapping[str, Any] | None = None
    accumulation: int = 1
    ddp: Any = None           # the DistributedDataParallel module kt.prepare made (a data-parallel rank)


def _set_nccl(variable: str) -> Callable[[Any, Trained], None]:
    """An NCCL setting, in the environment NCCL reads when the process group starts (kt.prepare
    starts it, after the Tuned that applied this): only in a CUDA rank of a data-parallel job."""
    def apply(value: Any, t: Trained) -> None:
        from knobtune.trainers.pytorch import distributed

        if value != "default" and t.device.type == "cuda" and distributed.active():
            os.environ[variable] = str(value)

    return apply


def _nccl_used(variable: str) -> Callable[[Trained], Any]:
    """Read back from the environment NCCL read when the process group started (UNREAD without one)."""
    return lambda t: UNREAD if t.ddp is None or t.device.type != "cuda" else os.environ.get(variable, "default")


def _from_ddp(name: str) -> Callable[[Trained], Any]:
    def read(t: Trained) -> Any:
        if t.ddp is None:
            return UNREAD
        from knobtune.trainers.pytorch import distributed

        return distributed.read_back(t.ddp)[name]

    return read


def _from_loader(attribute: str) -> Callable[[Trained], Any]:
    return lambda t: UNREAD if t.loader is None else getattr(t.loader, attribute)


def _in_order_used(t: Trained) -> Any:
    return UNREAD if t.loader is None else bool(getattr(t.loader, "in_order", True))


def _set_threads(value: Any, t: Trained) -> None:
    import torch

    if int(value or 0) > 0:
        torch.set_num_threads(int(value))


def _threads_used(t: Trained) -> Any:
    import torch

    return t.knobs["intra_op_threads"] and torch.get_num_threads()


def _cudnn(attribute: str) -> Callable[[Any, Trained], None]:
    def apply(value: Any, t: Trained) -> None:
        import torch

        if t.device.type == "cuda":
            setattr(torch.backends.cudnn, attribute, bool(value))

    return apply


def _cudnn_used(attribute: str) -> Callable[[Trained], bool]:
    def read(t: Trained) -> bool:
        import torch

        return getattr(torch.backends.cudnn, attribute)

    return read


def _set_matmul_precision(value: Any, t: Trained) -> None:
    import torch

    if t.device.type == "cuda":
        torch.set_float32_matmul_precision(value)


def _matmul_precision_used(t: Trained) -> str:
    import torch

    return torch.get_float32_matmul_precision()


def _amp_used(t: Trained) -> str:
    """Read from the autocast context made for the trial."""
    import torch

    if t.knobs["amp"] == "off":
        return "off"
    return {None: "off", torch.bfloat16: "bf16", torch.float16: "fp16"}[getattr(t.autocast, "fast_dtype", None)]


def _compile_used(t: Trained) -> str:
    """The compile mode that really ran: "off" after a fall-back to eager; "default" when a CUDA
    graph mode skipped its CUDA graphs (or runs on a CPU, where there are none)."""
    requested, report = t.knobs["compile"], t.compile_report
    if requested == "off" or report is None or report["eager_fallback"]:
        return "off"
    if requested == "reduce-overhead" and (report["cudagraph_skips"] or t.device.type != "cuda"):
        return "default"
    return requested


def _channels_last_used(t: Trained) -> bool:
    """Read from the convolution weights (the tensors channels_last is for), not any parameter."""
    import torch

    def used(model: Any) -> bool:
        convs = [m.weight for m in model.modules()
                 if isinstance(m, (torch.nn.Conv2d, torch.nn.ConvTranspose2d)) and m.weight.dim() == 4]
        return bool(convs) and all(w.is_contiguous(memory_format=torch.channels_last) for w in convs)

    return bool(t.models) and all(used(m) for m in t.models)


def impl_used(optimizer: Any) -> str:
    """Read back from the optimizer's param groups: ``fused``, ``foreach`` (asked for: torch's
    own choice when unset is ``default``) or ``default``."""
    groups = optimizer.param_groups
    if groups and all(g.get("fused") for g in groups):
        return "fused"
    if groups and all(g.get("foreach") for g in groups):
        return "foreach"
    return "default"


def _set_allocator(value: Any, t: Trained) -> None:
    """``expandable_segments`` for the CUDA caching allocator, before any CUDA memory is allocated:
    in the environment (where ``PYTORCH_CUDA_ALLOC_CONF`` is read: this process's allocator if
    it has not read it yet, and processes it starts) and through torch's allocator settings (read
    at every new segment)."""
    if t.device.type != "cuda" or not value:
        return
    import torch

    setting = "expandable_segments:True"
    kept = [part for part in os.environ.get(ALLOC_CONF, "").split(",")
            if part and not part.startswith("expandable_segments")]
    os.environ[ALLOC_CONF] = ",".join([*kept, setting])
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)  # torch >= 2.9
    if setter is None:
        setter = torch.cuda.memory._set_allocator_settings
    setter(setting)


def _expandable_segments_used(t: Trained) -> bool:
    """Read back from the CUDA caching allocator: whether it made expandable segments (CUDA
    graphs' private pools never are); without segments yet, its settings. False without CUDA."""
    import torch

    if t.device.type != "cuda" or not torch.cuda.is_initialized():
        return False
    segments = torch.cuda.memory_snapshot()
    if segments:
        return any(bool(s.get("is_expandable")) for s in segments)
    getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
    settings = getter() if getter is not None else os.environ.get(ALLOC_CONF, "")
    return "expandable_segments:true" in settings.replace(" ", "").lower()


HANDLERS = Handlers(SPACE, {
    "batch_size": Handling(read=_from_loader("batch_size")),
    "accumulation_steps": Handling(read=lambda t: t.accumulation),
    "num_workers": Handling(read=_from_loader("num_workers")),
    "prefetch_factor": Handling(read=_from_loader("prefetch_factor")),
    "persistent_workers": Handling(read=_from_loader("persistent_workers")),
    "intra_op_threads": Handling(apply=_set_threads, read=_threads_used),
    "pin_memory": Handling(read=_from_loader("pin_memory")),
    "amp": Handling(read=_amp_used),
    "compile": Handling(read=_compile_used),
    "channels_last": Handling(read=_channels_last_used),
    "cudnn_benchmark": Handling(apply=_cudnn("benchmark"), read=_cudnn_used("benchmark")),
    "cudnn_deterministic": Handling(apply=_cudnn("deterministic"), read=_cudnn_used("deterministic")),
    "matmul_precision": Handling(apply=_set_matmul_precision, read=_matmul_precision_used),
    "optimizer_impl": Handling(read=lambda t: UNREAD if t.optimizer is None else impl_used(t.optimizer)),
    "dataloader_in_order": Handling(read=_in_order_used),
    "group_by_length": Handling(read=lambda t: UNREAD if t.loader is None
                                else bool(getattr(t.loader, "grouped_by_length", False))),
    **{name: Handling(read=_from_ddp(name)) for name in DDP_KNOBS},
    "nccl_algo": Handling(environ=_set_nccl("NCCL_ALGO"), read=_nccl_used("NCCL_ALGO")),
    "nccl_proto": Handling(environ=_set_nccl("NCCL_PROTO"), read=_nccl_used("NCCL_PROTO")),
    "expandable_segments": Handling(environ=_set_allocator, read=_expandable_segments_used),
})
