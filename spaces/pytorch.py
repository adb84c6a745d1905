"""PyTorch's knobs (the seeds' advice, made searchable)."""
from __future__ import annotations

from typing import Any, Mapping

from knobtune.spaces.knobs import (Context, Knob, Space, accumulation_knob, batch_size_knob, core_counts, fits_cores,
                          hardware, one_of, positive, threads_knob, usable_cores)

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


KNOBS = (
    batch_size_knob(),
    accumulation_knob("the loss is divided by accumulation_steps"),
    Knob("num_workers", int, 0, "DataLoader worker processes",
         choices=core_counts, value_unavailable=fits_cores("workers"),
         check=lambda v: None if v >= 0 else f"must be >= 0, got {v}"),
    Knob("prefetch_factor", int, 2, "batches each worker loads ahead",
         choices=lambda ctx: [2, 4, 8], inactive=_needs_workers, check=positive),
    Knob("persistent_workers", bool, False, "keep workers alive between epochs",
         choices=lambda ctx: [False, True], inactive=_needs_workers),
    # Not in the seeds, but on a small CPU box it decides whether workers help at all: torch's
    # intra-op threads spin while waiting and take the cores the DataLoader workers need.
    threads_knob("torch.set_num_threads in the training process", "torch"),
    Knob("pin_memory", bool, False, "page-locked host batches for faster host-to-device copies",
         choices=lambda ctx: [False, True], unavailable=_no_cuda),
    Knob("amp", str, "off", "autocast: off, bf16, or fp16 with GradScaler",
         choices=_amp_choices, value_unavailable=_amp_value, check=one_of("off", "bf16", "fp16")),
    Knob("compile", str, "off", "torch.compile mode",
         choices=_compile_choices, value_unavailable=_compile_value,
         check=one_of("off", "default", "reduce-overhead", "max-autotune")),
    Knob("channels_last", bool, False, "NHWC memory format for conv nets",
         choices=lambda ctx: [False, True], unavailable=_no_conv),
    Knob("cudnn_benchmark", bool, False, "torch.backends.cudnn.benchmark (autotune conv algorithms)",
         choices=lambda ctx: [False, True], unavailable=_no_cudnn),
    Knob("cudnn_deterministic", bool, False, "torch.backends.cudnn.deterministic",
         choices=lambda ctx: [False, True], unavailable=_no_cudnn),
    # TensorFlow runs fp32 matmuls in TF32 by default on Ampere and newer, PyTorch does not: the
    # knob that makes a framework comparison fair (and is often free speed).
    Knob("matmul_precision", str, "highest",
         "torch.set_float32_matmul_precision: 'highest' (IEEE fp32) or 'high' (TF32 tensor cores)",
         choices=lambda ctx: ["highest", "high"], unavailable=_no_tf32, inactive=_under_autocast,
         check=one_of("highest", "high", "medium")),
    # Measured a few to 15 % faster, sometimes slower: searched, never assumed.
    Knob("optimizer_impl", str, "default",
         "the optimizer rebuilt with foreach=True (multi-tensor kernels) or fused=True (one kernel), or as built",
         choices=_optimizer_impls, unavailable=_no_optimizer_impl, value_unavailable=_optimizer_impl_value,
         check=one_of("default", "foreach", "fused")),
    Knob("dataloader_in_order", bool, True,
         "DataLoader in_order: false hands batches out as workers finish them (a slow sample stalls no one)",
         choices=lambda ctx: [True, False], unavailable=_no_in_order, inactive=_needs_workers),
    Knob("expandable_segments", bool, False,
         "CUDA caching allocator expandable_segments (PYTORCH_CUDA_ALLOC_CONF): less fragmentation",
         choices=lambda ctx: [False, True], unavailable=_no_cuda),
)

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


SPACE = Space("pytorch", KNOBS, advice=advice, input_variants=input_variants, invalid=invalid)
