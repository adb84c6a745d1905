"""PyTorch's knobs (the seeds' advice, made searchable): each one's choices, gating, how the
child applies it and reads it back, and its lines in the export snippet."""
from __future__ import annotations

from typing import Any, Callable, Mapping

from knobtune.spaces import libraries
from knobtune.spaces.knobs import (
    Context,
    Knob,
    Lines,
    Shown,
    Space,
    accumulation_knob,
    batch_size_knob,
    core_counts,
    fits_cores,
    hardware,
    one_of,
    positive,
    threads_knob,
    usable_cores,
)

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


def _no_lengths(ctx: Context) -> str | None:
    workload = ctx.get("workload", {})
    if workload.get("integration") != libraries.HF:
        return "only Hugging Face's Trainer groups batches by length (kt.training_arguments)"
    return None if workload.get("variable_lengths") else "the training samples all have the same length"


def _group(ctx: Context) -> Mapping[str, Any]:
    """The probe's word on a data-parallel study (``[study] nproc`` > 1): its backend and the
    communication hooks that backend accepts; empty for a one-process study."""
    return ctx.get("workload", {}).get("distributed") or {}


def _no_group(ctx: Context) -> str | None:
    return None if _group(ctx) else "a one-process trial has no DistributedDataParallel ([study] nproc = 1)"


def _no_nccl(ctx: Context) -> str | None:
    backend = _group(ctx).get("backend")
    return _no_group(ctx) or (None if backend == "nccl" else
                              f"the {backend} backend is not NCCL (NCCL runs data-parallel CUDA jobs)")


def _nccl_env(variable: str) -> Callable[[Any], Lines]:
    return lambda v: Lines(env=(f"os.environ['{variable}'] = {v!r}  # before the process group starts",)) \
        if v != "default" else Lines()


def _no_buffers(ctx: Context) -> str | None:
    return _no_group(ctx) or (None if ctx.get("workload", {}).get("buffers", 1) else "the model has no buffers")


def _comm_hooks(ctx: Context) -> list[str]:
    return list(_group(ctx).get("comm_hooks") or ["none"])


def _comm_hook_value(value: Any, ctx: Context) -> str | None:
    return None if value in _comm_hooks(ctx) else (
        f"the {_group(ctx).get('backend', 'process group')} backend here does not take the {value} compression hook")


DDP_KNOBS = ("ddp_bucket_cap_mb", "ddp_gradient_as_bucket_view", "ddp_static_graph", "ddp_broadcast_buffers",
             "ddp_comm_hook")


def _ddp_lines(shown: Shown) -> list[str]:
    """The DistributedDataParallel line of a data-parallel export (none for a one-process study)."""
    if not any(shown.on(name) for name in DDP_KNOBS):
        return []
    args = ["device_ids=[local_rank] if device.type == 'cuda' else None"]
    for name, argument, default in (("ddp_bucket_cap_mb", "bucket_cap_mb", 25),
                                    ("ddp_gradient_as_bucket_view", "gradient_as_bucket_view", False),
                                    ("ddp_static_graph", "static_graph", False),
                                    ("ddp_broadcast_buffers", "broadcast_buffers", True)):
        if shown.value(name, default) != default:
            args.append(f"{argument}={shown.value(name, default)!r}")
    out = ["model = torch.nn.parallel.DistributedDataParallel(model, " + ", ".join(args) + ")"]
    hook = shown.value("ddp_comm_hook", "none")
    if hook != "none":
        out += ["from torch.distributed.algorithms.ddp_comm_hooks import default_hooks",
                f"model.register_comm_hook(None, default_hooks.{hook}_compress_hook)"]
    return out


CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def _graphs_over_accumulation(values: Mapping[str, Any], cuda: bool) -> str | None:
    """CUDA graphs and gradient accumulation: AccumulateGrad keeps the first backward's gradient,
    which lives in the CUDA-graph pool, as .grad; the next replay overwrites it."""
    mode, accumulation = values.get("compile"), int(values.get("accumulation_steps", 1))
    if cuda and mode in CUDA_GRAPH_MODES and accumulation > 1:
        return (f"compile={mode!r} replays CUDA graphs, which overwrite gradients accumulated across "
                f"micro-batches: accumulation_steps={accumulation} needs compile 'off' or 'default'")
    return None


def invalid(values: Mapping[str, Any], ctx: Context) -> str | None:
    """A combination that cannot train correctly here (refused before any child runs)."""
    return _graphs_over_accumulation(values, bool(_hw(ctx).get("cuda")))


# Environment variables a knob's snippet lines set (its child side: trainers/pytorch/knobs.py).
ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"


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
# trainers/pytorch/env.hardware() for that device, and "torch" its version.
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
    return _graphs_over_accumulation({**knobs, "compile": value}, bool(hw.get("cuda")))


def _cuda_only(what: str) -> Callable[[Any, Mapping[str, Any], Mapping[str, Any]], str | None]:
    def problem(value: Any, knobs: Mapping[str, Any], hw: Mapping[str, Any]) -> str | None:
        return f"{what}; {NO_CUDA_HERE}" if value and not hw.get("cuda") else None

    return problem


def _in_order_problem(value: Any, knobs: Mapping[str, Any], hw: Mapping[str, Any]) -> str | None:
    if value is False and not hw.get("loader_in_order"):
        return (f"dataloader_in_order=False needs torch >= 2.6 (DataLoader's in_order argument); this is "
                f"torch {hw.get('torch', '?')}")
    return None


KNOBS = (
    batch_size_knob(applied_by="dataloader",
                    lines=lambda v: _code(f"batch_size={int(v)}")),
    accumulation_knob("the loss is divided by accumulation_steps", applied_by="backward"),
    Knob("num_workers", int, 0, "DataLoader worker processes",
         choices=core_counts, value_unavailable=fits_cores("workers"),
         check=lambda v: None if v >= 0 else f"must be >= 0, got {v}",
         applied_by="dataloader",
         lines=lambda v: _code(f"num_workers={int(v)}") if int(v or 0) else Lines()),
    Knob("prefetch_factor", int, 2, "batches each worker loads ahead",
         choices=lambda ctx: [2, 4, 8], inactive=_needs_workers, check=positive,
         applied_by="dataloader",
         lines=lambda v: _code(f"prefetch_factor={int(v)}")),
    Knob("persistent_workers", bool, False, "keep workers alive between epochs",
         choices=lambda ctx: [False, True], inactive=_needs_workers,
         applied_by="dataloader",
         lines=lambda v: _code(f"persistent_workers={bool(v)}")),
    # Not in the seeds, but on a small CPU box it decides whether workers help at all: torch's
    # intra-op threads spin while waiting and take the cores the DataLoader workers need.
    threads_knob("torch.set_num_threads in the training process", "torch",
                 lines=lambda v: _code(f"torch.set_num_threads({int(v)})") if v else Lines()),
    Knob("pin_memory", bool, False, "page-locked host batches for faster host-to-device copies",
         choices=lambda ctx: [False, True], unavailable=_no_cuda,
         applied_by="dataloader",
         problem=_cuda_only("pin_memory=True needs CUDA"),
         lines=lambda v: _code("pin_memory=True") if v else Lines()),
    Knob("amp", str, "off", "autocast: off, bf16, or fp16 with GradScaler",
         choices=_amp_choices, value_unavailable=_amp_value, check=one_of("off", "bf16", "fp16"),
         applied_by="autocast", problem=_amp_problem,
         lines=lambda v: _code("scaler = torch.amp.GradScaler(device.type)") if v == "fp16" else Lines()),
    Knob("compile", str, "off", "torch.compile mode",
         choices=_compile_choices, value_unavailable=_compile_value,
         check=one_of("off", "default", "reduce-overhead", "max-autotune"),
         applied_by="prepare", lines=_compile_line, problem=_compile_problem),
    Knob("channels_last", bool, False, "NHWC memory format for conv nets",
         choices=lambda ctx: [False, True], unavailable=_no_conv,
         applied_by="prepare",
         lines=lambda v: _code("model = model.to(memory_format=torch.channels_last)") if v else Lines()),
    Knob("cudnn_benchmark", bool, False, "torch.backends.cudnn.benchmark (autotune conv algorithms)",
         choices=lambda ctx: [False, True], unavailable=_no_cudnn,
         lines=lambda v: _code(f"torch.backends.cudnn.benchmark = {bool(v)}")),
    Knob("cudnn_deterministic", bool, False, "torch.backends.cudnn.deterministic",
         choices=lambda ctx: [False, True], unavailable=_no_cudnn,
         lines=lambda v: _code(f"torch.backends.cudnn.deterministic = {bool(v)}")),
    # TensorFlow runs fp32 matmuls in TF32 by default on Ampere and newer, PyTorch does not: the
    # knob that makes a framework comparison fair (and is often free speed).
    Knob("matmul_precision", str, "highest",
         "torch.set_float32_matmul_precision: 'highest' (IEEE fp32) or 'high' (TF32 tensor cores)",
         choices=lambda ctx: ["highest", "high"], unavailable=_no_tf32, inactive=_under_autocast,
         check=one_of("highest", "high", "medium"),
         lines=lambda v: _code(f"torch.set_float32_matmul_precision({v!r})") if v != "highest" else Lines()),
    # Measured a few to 15 % faster, sometimes slower: searched, never assumed.
    Knob("optimizer_impl", str, "default",
         "the optimizer rebuilt with foreach=True (multi-tensor kernels) or fused=True (one kernel), or as built",
         choices=_optimizer_impls, unavailable=_no_optimizer_impl, value_unavailable=_optimizer_impl_value,
         check=one_of("default", "foreach", "fused"),
         applied_by="prepare_optimizer",
         lines=_optimizer_impl_lines),
    Knob("dataloader_in_order", bool, True,
         "DataLoader in_order: false hands batches out as workers finish them (a slow sample stalls no one)",
         choices=lambda ctx: [True, False], unavailable=_no_in_order, inactive=_needs_workers,
         applied_by="dataloader", problem=_in_order_problem,
         lines=lambda v: _code("in_order=False") if v is False else Lines()),
    Knob("group_by_length", bool, False,
         "Hugging Face Trainer's train_sampling_strategy='group_by_length': batches of similar lengths, less padding",
         choices=lambda ctx: [False, True], unavailable=_no_lengths, applied_by="training_arguments"),
    # Data-parallel trials ([study] nproc > 1): DistributedDataParallel's settings (kt.prepare).
    Knob("ddp_bucket_cap_mb", int, 25, "DistributedDataParallel bucket_cap_mb: gradients all-reduced per bucket",
         choices=lambda ctx: [5, 25, 100], unavailable=_no_group, check=positive, applied_by="prepare"),
    Knob("ddp_gradient_as_bucket_view", bool, False,
         "DistributedDataParallel gradient_as_bucket_view: gradients are views into the buckets (no copy)",
         choices=lambda ctx: [False, True], unavailable=_no_group, applied_by="prepare"),
    Knob("ddp_static_graph", bool, False,
         "DistributedDataParallel static_graph: the same parameters are used every step",
         choices=lambda ctx: [False, True], unavailable=_no_group, applied_by="prepare"),
    Knob("ddp_broadcast_buffers", bool, True,
         "DistributedDataParallel broadcast_buffers: rank 0's buffers (batch-norm statistics) sent every forward",
         choices=lambda ctx: [True, False], unavailable=_no_buffers, applied_by="prepare"),
    Knob("ddp_comm_hook", str, "none", "gradient compression before the all-reduce: none, fp16 or bf16",
         choices=_comm_hooks, unavailable=_no_group, value_unavailable=_comm_hook_value,
         check=one_of("none", "fp16", "bf16"), applied_by="prepare"),
    # NCCL's own choices, searched only where NCCL runs (set in the rank before its process group starts)
    Knob("nccl_algo", str, "default", "NCCL_ALGO: the all-reduce algorithm (default: NCCL's own choice per size)",
         choices=lambda ctx: ["default", "Ring", "Tree"], unavailable=_no_nccl,
         check=one_of("default", "Ring", "Tree"), lines=_nccl_env("NCCL_ALGO")),
    Knob("nccl_proto", str, "default", "NCCL_PROTO: the protocol (default: NCCL's own choice per size)",
         choices=lambda ctx: ["default", "Simple", "LL", "LL128"], unavailable=_no_nccl,
         check=one_of("default", "Simple", "LL", "LL128"), lines=_nccl_env("NCCL_PROTO")),
    Knob("expandable_segments", bool, False,
         "CUDA caching allocator expandable_segments (PYTORCH_CUDA_ALLOC_CONF): less fragmentation",
         choices=lambda ctx: [False, True], unavailable=_no_cuda,
         problem=_cuda_only("expandable_segments=True is a setting of the CUDA caching allocator"),
         lines=lambda v: Lines(env=(f"os.environ['{ALLOC_CONF}'] = 'expandable_segments:True'  # before torch "
                                    f"allocates CUDA memory",)) if v else Lines()),
)


def script(shown: Shown) -> str:
    """The export snippet: a PyTorch training loop with the shown knobs' lines in their places
    (amp, accumulation_steps, compile, pin_memory and channels_last shape the loop itself)."""
    setup = shown.lines("expandable_segments", "nccl_algo", "nccl_proto", "intra_op_threads", "cudnn_benchmark",
                        "cudnn_deterministic", "matmul_precision")
    ddp = _ddp_lines(shown)
    out = ["import torch", "from torch.utils.data import DataLoader", "", *setup.code]
    if ddp:  # a data-parallel winner: every rank runs this script (torchrun sets RANK, LOCAL_RANK, WORLD_SIZE)
        out = ["import os", "import torch", "from torch.utils.data import DataLoader, DistributedSampler", "",
               *setup.code, "torch.distributed.init_process_group()  # launched by torchrun --nproc_per_node N",
               "local_rank = int(os.environ['LOCAL_RANK'])"]
    args = [*shown.lines("batch_size").code, "sampler=DistributedSampler(train_set)" if ddp else "shuffle=True"]
    if int(shown.value("num_workers", 0) or 0):
        args += shown.lines("num_workers", "prefetch_factor", "persistent_workers", "dataloader_in_order").code
    args += shown.lines("pin_memory").code
    out += ["", f"train_loader = DataLoader(train_set, {', '.join(args)})", "", "model = model.to(device)",
            *shown.lines("channels_last").code, *ddp, *shown.lines("compile").code, "",
            *shown.lines("optimizer_impl").code,
            *shown.learning_rate("for group in optimizer.param_groups:\n    group['lr'] = {lr}"),
            *shown.lines("amp").code]
    trained = "model" if shown.value("compile", "off") == "off" else "trained"
    amp = shown.value("amp", "off")
    k = int(shown.value("accumulation_steps", 1) or 1)
    copy = ", non_blocking=True" if shown.value("pin_memory", False) else ""
    loss = "loss / " + str(k) if k > 1 else "loss"
    out += ["for epoch in range(epochs):", *(["    train_loader.sampler.set_epoch(epoch)"] if ddp else []),
            f"    {trained}.train()",
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
        # AMP: bf16 where the device does it in hardware (no loss scaling needed), else fp16 with
        # GradScaler on GPU; a CPU without bf16 instructions emulates it, slower than fp32. (A
        # context without ``bf16_native``, an older study's, takes ``bf16`` for it.)
        "amp": "bf16" if hw.get("bf16_native", hw.get("bf16")) else ("fp16" if cuda else "off"),
        "compile": "default",
        "channels_last": True,
        "cudnn_benchmark": True,
        "cudnn_deterministic": False,
    }


def input_variants(ctx: Context) -> dict[str, dict[str, Any]]:
    cores = usable_cores(ctx)
    return {f"{cores} workers": {"num_workers": cores, "persistent_workers": True, "prefetch_factor": 4,
                                 "intra_op_threads": 1}}


SPACE = Space("pytorch", KNOBS, advice=advice, input_variants=input_variants, invalid=invalid, script=script,
              integrations={libraries.HF: libraries.hf_script, libraries.LIGHTNING: libraries.lightning_script},
              learning_knobs=("batch_size", "accumulation_steps", "amp", "matmul_precision", "group_by_length"))
