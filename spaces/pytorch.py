"""PyTorch's knobs (the seeds' advice, made searchable): each one's choices, gating, how the
child applies it and reads it back, and its lines in the export snippet."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from knobtune.spaces.knobs import (UNREAD, Context, Knob, Lines, Shown, Space, accumulation_knob, batch_size_knob,
                                   core_counts, fits_cores, hardware, one_of, positive, threads_knob, usable_cores)

NEEDS_CUDA = "needs CUDA; this machine has no CUDA device"
_hw = hardware


def _no_cuda(ctx: Context) -> str | None:
    return None if _hw(ctx).get("cuda") else NEEDS_CUDA


def _needs_workers(values: Mapping[str, Any]) -> str | None:
    return None if values.get("num_workers", 0) > 0 else "needs num_workers > 0"


def _amp_choices(ctx: Context) -> list[str]:
    hw = _hw(ctx)
    return ["off"] + (["bf16"] if hw.get("bf16") else []) + (["fp16"] if hw.get("cuda") else [])


def _amp_value(value: Any, ctx: Context) -> str | None:
    hw = _hw(ctx)
    if value == "fp16" and not hw.get("cuda"):
        return "fp16 with GradScaler needs CUDA"
    if value == "bf16" and not hw.get("bf16"):
        return "this device does not support bfloat16"
    return None


def _compile_choices(ctx: Context) -> list[str]:
    if _hw(ctx).get("cuda"):
        return ["off", "default", "reduce-overhead", "max-autotune"]
    return ["off", "default", "max-autotune"]


def _compile_value(value: Any, ctx: Context) -> str | None:
    if value == "reduce-overhead" and not _hw(ctx).get("cuda"):
        return "reduce-overhead captures CUDA graphs and needs CUDA"
    return None


def _no_conv(ctx: Context) -> str | None:
    return None if ctx.get("workload", {}).get("conv") else "the model has no convolutions"


def _no_cudnn(ctx: Context) -> str | None:
    return _no_cuda(ctx) or _no_conv(ctx)


def _no_tf32(ctx: Context) -> str | None:
    if not _hw(ctx).get("cuda"):
        return NEEDS_CUDA
    return None if _hw(ctx).get("tf32") else "this GPU has no TF32 tensor cores (before Ampere)"


def _under_autocast(values: Mapping[str, Any]) -> str | None:
    amp = values.get("amp", "off")
    return None if amp == "off" else f"amp={amp} runs matmuls in {amp}: the fp32 precision does not apply"


def _optimizer_impls(ctx: Context) -> list[str]:
    """The implementations the workload's optimizer stepped with on this device (the probe tried them)."""
    return list(ctx.get("workload", {}).get("optimizer_impls") or ["default"])


def _no_optimizer_impl(ctx: Context) -> str | None:
    if len(_optimizer_impls(ctx)) > 1:
        return None
    workload = ctx.get("workload", {})
    if "optimizer" not in workload:
        return "the probe did not describe the workload's optimizer"
    name = workload["optimizer"]
    if not name:
        return "the script never passes its optimizer to kt.prepare(model, optimizer)"
    return f"{name} has no foreach or fused implementation that runs on this device"


def _optimizer_impl_value(value: Any, ctx: Context) -> str | None:
    if value in _optimizer_impls(ctx):
        return None
    return f"{ctx.get('workload', {}).get('optimizer') or 'the optimizer'} has no {value} implementation here"


def _no_in_order(ctx: Context) -> str | None:
    return None if _hw(ctx).get("loader_in_order") else "needs torch >= 2.6 (the DataLoader's in_order argument)"


CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def invalid(values: Mapping[str, Any], ctx: Context) -> str | None:
    """A combination that cannot train correctly here (refused before any child runs)."""
    if (_hw(ctx).get("cuda") and values.get("compile") in CUDA_GRAPH_MODES
            and int(values.get("accumulation_steps", 1)) > 1):
        return (f"compile={values['compile']!r} replays CUDA graphs, which overwrite gradients accumulated across "
                f"micro-batches: accumulation_steps={values['accumulation_steps']} needs compile 'off' or 'default'")
    return None


# ----------------------------------------------------------------- in the child
# How each knob is applied and read back (torch imported here, in the child only) and its lines
# in the export snippet. Knobs the DataLoader, the model's preparation or the optimizer's rebuild
# apply together are applied by that call (trainers/pytorch/knobs.py); they are read back here.

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"


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


def _code(*lines: str) -> Lines:
    return Lines(code=lines)


def _compile_line(value: Any) -> Lines:
    if value == "off":
        return Lines()
    mode = "" if value == "default" else f", mode={value!r}"
    return _code(f"trained = torch.compile(model{mode})  # evaluate with `model`: it shares the weights")


def _optimizer_impl_lines(value: Any) -> Lines:
    if value == "default":
        return Lines()
    return _code(f"# measured with the optimizer built with {value}=True, e.g. torch.optim.Adam(model.parameters(), "
                 f"lr=..., {value}=True)", "")


# Why this process's device cannot apply a value (in the child and in production): ``hw`` is
# trainers/pytorch/env.hardware() for that device.
NO_CUDA_HERE = "this process has no CUDA device"


def _amp_problem(value: Any, knobs: Mapping[str, Any], hw: Mapping[str, Any]) -> str | None:
    if value == "fp16" and not hw.get("cuda"):
        return f"amp='fp16' (with GradScaler) needs CUDA; {NO_CUDA_HERE}"
    if value == "bf16" and hw.get("cuda") and not hw.get("bf16"):
        return "amp='bf16' is not supported by this GPU"
    return None


def _compile_problem(value: Any, knobs: Mapping[str, Any], hw: Mapping[str, Any]) -> str | None:
    if value == "reduce-overhead" and not hw.get("cuda"):
        return "compile='reduce-overhead' captures CUDA graphs and needs CUDA"
    accumulation = int(knobs.get("accumulation_steps", 1))
    if hw.get("cuda") and value in ("reduce-overhead", "max-autotune") and accumulation > 1:
        # AccumulateGrad keeps the first backward's gradient, which lives in the CUDA-graph pool,
        # as .grad; the next replay overwrites it.
        return (f"compile={value!r} replays CUDA graphs, which overwrite gradients accumulated across "
                f"micro-batches: accumulation_steps={accumulation} needs compile 'off' or 'default'")
    return None


def _cuda_only(what: str) -> Callable[[Any, Mapping[str, Any], Mapping[str, Any]], str | None]:
    def problem(value: Any, knobs: Mapping[str, Any], hw: Mapping[str, Any]) -> str | None:
        return f"{what}; {NO_CUDA_HERE}" if value and not hw.get("cuda") else None

    return problem


def _in_order_problem(value: Any, knobs: Mapping[str, Any], hw: Mapping[str, Any]) -> str | None:
    if value is False and not hw.get("loader_in_order"):
        import torch

        return (f"dataloader_in_order=False needs torch >= 2.6 (DataLoader's in_order argument); this is "
                f"torch {torch.__version__}")
    return None


KNOBS = (
    batch_size_knob(applied_by="dataloader", read=_from_loader("batch_size"),
                    lines=lambda v: _code(f"batch_size={int(v)}")),
    accumulation_knob("the loss is divided by accumulation_steps", applied_by="backward",
                      read=lambda t: t.accumulation),
    Knob("num_workers", int, 0, "DataLoader worker processes",
         choices=core_counts, value_unavailable=fits_cores("workers"),
         check=lambda v: None if v >= 0 else f"must be >= 0, got {v}",
         applied_by="dataloader", read=_from_loader("num_workers"),
         lines=lambda v: _code(f"num_workers={int(v)}") if int(v or 0) else Lines()),
    Knob("prefetch_factor", int, 2, "batches each worker loads ahead",
         choices=lambda ctx: [2, 4, 8], inactive=_needs_workers, check=positive,
         applied_by="dataloader", read=_from_loader("prefetch_factor"),
         lines=lambda v: _code(f"prefetch_factor={int(v)}")),
    Knob("persistent_workers", bool, False, "keep workers alive between epochs",
         choices=lambda ctx: [False, True], inactive=_needs_workers,
         applied_by="dataloader", read=_from_loader("persistent_workers"),
         lines=lambda v: _code(f"persistent_workers={bool(v)}")),
    # Not in the seeds, but on a small CPU box it decides whether workers help at all: torch's
    # intra-op threads spin while waiting and take the cores the DataLoader workers need.
    threads_knob("torch.set_num_threads in the training process", "torch", apply=_set_threads, read=_threads_used,
                 lines=lambda v: _code(f"torch.set_num_threads({int(v)})") if v else Lines()),
    Knob("pin_memory", bool, False, "page-locked host batches for faster host-to-device copies",
         choices=lambda ctx: [False, True], unavailable=_no_cuda,
         applied_by="dataloader", read=_from_loader("pin_memory"),
         problem=_cuda_only("pin_memory=True needs CUDA"),
         lines=lambda v: _code("pin_memory=True") if v else Lines()),
    Knob("amp", str, "off", "autocast: off, bf16, or fp16 with GradScaler",
         choices=_amp_choices, value_unavailable=_amp_value, check=one_of("off", "bf16", "fp16"),
         applied_by="autocast", read=_amp_used, problem=_amp_problem,
         lines=lambda v: _code("scaler = torch.amp.GradScaler(device.type)") if v == "fp16" else Lines()),
    Knob("compile", str, "off", "torch.compile mode",
         choices=_compile_choices, value_unavailable=_compile_value,
         check=one_of("off", "default", "reduce-overhead", "max-autotune"),
         applied_by="prepare", read=_compile_used, lines=_compile_line, problem=_compile_problem),
    Knob("channels_last", bool, False, "NHWC memory format for conv nets",
         choices=lambda ctx: [False, True], unavailable=_no_conv,
         applied_by="prepare", read=_channels_last_used,
         lines=lambda v: _code("model = model.to(memory_format=torch.channels_last)") if v else Lines()),
    Knob("cudnn_benchmark", bool, False, "torch.backends.cudnn.benchmark (autotune conv algorithms)",
         choices=lambda ctx: [False, True], unavailable=_no_cudnn,
         apply=_cudnn("benchmark"), read=_cudnn_used("benchmark"),
         lines=lambda v: _code(f"torch.backends.cudnn.benchmark = {bool(v)}")),
    Knob("cudnn_deterministic", bool, False, "torch.backends.cudnn.deterministic",
         choices=lambda ctx: [False, True], unavailable=_no_cudnn,
         apply=_cudnn("deterministic"), read=_cudnn_used("deterministic"),
         lines=lambda v: _code(f"torch.backends.cudnn.deterministic = {bool(v)}")),
    # TensorFlow runs fp32 matmuls in TF32 by default on Ampere and newer, PyTorch does not: the
    # knob that makes a framework comparison fair (and is often free speed).
    Knob("matmul_precision", str, "highest",
         "torch.set_float32_matmul_precision: 'highest' (IEEE fp32) or 'high' (TF32 tensor cores)",
         choices=lambda ctx: ["highest", "high"], unavailable=_no_tf32, inactive=_under_autocast,
         check=one_of("highest", "high", "medium"),
         apply=_set_matmul_precision, read=_matmul_precision_used,
         lines=lambda v: _code(f"torch.set_float32_matmul_precision({v!r})") if v != "highest" else Lines()),
    # Measured a few to 15 % faster, sometimes slower: searched, never assumed.
    Knob("optimizer_impl", str, "default",
         "the optimizer rebuilt with foreach=True (multi-tensor kernels) or fused=True (one kernel), or as built",
         choices=_optimizer_impls, unavailable=_no_optimizer_impl, value_unavailable=_optimizer_impl_value,
         check=one_of("default", "foreach", "fused"),
         applied_by="prepare_optimizer", read=lambda t: UNREAD if t.optimizer is None else impl_used(t.optimizer),
         lines=_optimizer_impl_lines),
    Knob("dataloader_in_order", bool, True,
         "DataLoader in_order: false hands batches out as workers finish them (a slow sample stalls no one)",
         choices=lambda ctx: [True, False], unavailable=_no_in_order, inactive=_needs_workers,
         applied_by="dataloader", read=_in_order_used, problem=_in_order_problem,
         lines=lambda v: _code("in_order=False") if v is False else Lines()),
    Knob("expandable_segments", bool, False,
         "CUDA caching allocator expandable_segments (PYTORCH_CUDA_ALLOC_CONF): less fragmentation",
         choices=lambda ctx: [False, True], unavailable=_no_cuda,
         environ=_set_allocator, read=_expandable_segments_used,
         problem=_cuda_only("expandable_segments=True is a setting of the CUDA caching allocator"),
         lines=lambda v: Lines(env=(f"os.environ['{ALLOC_CONF}'] = 'expandable_segments:True'  # before torch "
                                    f"allocates CUDA memory",)) if v else Lines()),
)


def script(shown: Shown) -> str:
    """The export snippet: a PyTorch training loop with the shown knobs' lines in their places
    (amp, accumulation_steps, compile, pin_memory and channels_last shape the loop itself)."""
    setup = shown.lines("expandable_segments", "intra_op_threads", "cudnn_benchmark", "cudnn_deterministic",
                        "matmul_precision")
    out = ["import torch", "from torch.utils.data import DataLoader", "", *setup.code]
    args = [*shown.lines("batch_size").code, "shuffle=True"]
    if int(shown.value("num_workers", 0) or 0):
        args += shown.lines("num_workers", "prefetch_factor", "persistent_workers", "dataloader_in_order").code
    args += shown.lines("pin_memory").code
    out += ["", f"train_loader = DataLoader(train_set, {', '.join(args)})", "", "model = model.to(device)",
            *shown.lines("channels_last", "compile").code, "", *shown.lines("optimizer_impl").code,
            *shown.learning_rate("for group in optimizer.param_groups:\n    group['lr'] = {lr}"),
            *shown.lines("amp").code]
    trained = "model" if shown.value("compile", "off") == "off" else "trained"
    amp = shown.value("amp", "off")
    k = int(shown.value("accumulation_steps", 1) or 1)
    copy = ", non_blocking=True" if shown.value("pin_memory", False) else ""
    loss = "loss / " + str(k) if k > 1 else "loss"
    out += ["for epoch in range(epochs):", f"    {trained}.train()",
            "    for step, (x, y) in enumerate(train_loader):",
            f"        x, y = x.to(device{copy}), y.to(device{copy})"]
    if shown.value("channels_last", False):
        out.append("        x = x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x")
    if amp != "off":
        dtype = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}[amp]
        out += [f"        with torch.autocast(device_type=device.type, dtype={dtype}):",
                f"            loss = loss_fn({trained}(x), y)"]
    else:
        out.append(f"        loss = loss_fn({trained}(x), y)")
    if amp == "fp16":
        out.append(f"        scaler.scale({loss}).backward()")
        step = ["scaler.step(optimizer)", "scaler.update()", "optimizer.zero_grad(set_to_none=True)"]
    else:
        out.append(f"        ({loss}).backward()" if k > 1 else "        loss.backward()")
        step = ["optimizer.step()", "optimizer.zero_grad(set_to_none=True)"]
    if k > 1:
        out.append(f"        if (step + 1) % {k} == 0:  # accumulation_steps = {k}")
        out += [f"            {s}" for s in step]
    else:
        out += [f"        {s}" for s in step]
    return shown.source(setup.env, out)


def advice(ctx: Context) -> dict[str, Any]:
    """What the seeds tell a PyTorch user to do by hand (shared/seeds/), for this hardware."""
    hw = _hw(ctx)
    cuda = bool(hw.get("cuda"))
    cores = int(hw.get("usable_cores", 1))
    workers = min(8, cores)  # "a few per core, but no more than 8"
    return {
        "num_workers": workers,
        # knobtune's own addition: on a CPU-only box the workers and torch's threads share the cores
        "intra_op_threads": 0 if cuda else max(1, cores - workers),
        "persistent_workers": True,
        "prefetch_factor": 2,
        "pin_memory": cuda,
        # AMP: bf16 where the device has it (no loss scaling needed), else fp16 with GradScaler on GPU
        "amp": "bf16" if hw.get("bf16") else ("fp16" if cuda else "off"),
        "compile": "default",
        "channels_last": True,
        "cudnn_benchmark": True,
        "cudnn_deterministic": False,
    }


def input_variants(ctx: Context) -> dict[str, dict[str, Any]]:
    cores = usable_cores(ctx)
    return {f"{cores} workers": {"num_workers": cores, "persistent_workers": True, "prefetch_factor": 4,
                                 "intra_op_threads": 1}}


SPACE = Space("pytorch", KNOBS, advice=advice, input_variants=input_variants, invalid=invalid, script=script)
