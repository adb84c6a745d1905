"""PyTorch's knobs (the seeds' advice, made searchable)."""
from __future__ import annotations

from typing import Any, Mapping

from spaces.knobs import Context, Knob, Space

NEEDS_CUDA = "needs CUDA; this machine has no CUDA device"


def _hw(ctx: Context) -> Mapping[str, Any]:
    return ctx.get("hardware", {})


def _no_cuda(ctx: Context) -> str | None:
    return None if _hw(ctx).get("cuda") else NEEDS_CUDA


def _positive(value: Any) -> str | None:
    return None if value >= 1 else f"must be >= 1, got {value}"


def _worker_choices(ctx: Context) -> list[int]:
    cores = int(_hw(ctx).get("usable_cores", 1))
    return sorted({0, cores, *[n for n in (1, 2, 4, 8, 16, 32) if n <= cores]})


def _workers_fit(value: Any, ctx: Context) -> str | None:
    cores = int(_hw(ctx).get("usable_cores", 1))
    return None if value <= cores else f"more workers than the {cores} cores this process may use"


def _thread_choices(ctx: Context) -> list[int]:
    cores = int(_hw(ctx).get("usable_cores", 1))
    return sorted({0, 1, cores, *[n for n in (2, 4, 8, 16) if n <= cores]})


def _threads_fit(value: Any, ctx: Context) -> str | None:
    cores = int(_hw(ctx).get("usable_cores", 1))
    return None if value <= cores else f"more threads than the {cores} cores this process may use"


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


def _one_of(*allowed: str):
    def check(value: Any) -> str | None:
        return None if value in allowed else f"expected one of {', '.join(map(repr, allowed))}, got {value!r}"

    return check


KNOBS = (
    Knob("batch_size", int, 64, "samples per micro-batch",
         choices=lambda ctx: [32, 64, 128, 256, 512], check=_positive),
    Knob("accumulation_steps", int, 1,
         "micro-batches per optimizer step (effective batch = batch_size x accumulation_steps)",
         choices=lambda ctx: [1, 2, 4], check=_positive),
    Knob("num_workers", int, 0, "DataLoader worker processes",
         choices=_worker_choices, value_unavailable=_workers_fit,
         check=lambda v: None if v >= 0 else f"must be >= 0, got {v}"),
    Knob("prefetch_factor", int, 2, "batches each worker loads ahead",
         choices=lambda ctx: [2, 4, 8], inactive=_needs_workers, check=_positive),
    Knob("persistent_workers", bool, False, "keep workers alive between epochs",
         choices=lambda ctx: [False, True], inactive=_needs_workers),
    # Not in the seeds, but on a small CPU box it decides whether workers help at all: torch's
    # intra-op threads spin while waiting and take the cores the DataLoader workers need.
    Knob("intra_op_threads", int, 0, "torch.set_num_threads in the training process (0 = torch's default)",
         choices=_thread_choices, value_unavailable=_threads_fit,
         check=lambda v: None if v >= 0 else f"must be >= 0 (0 = torch's default), got {v}"),
    Knob("pin_memory", bool, False, "page-locked host batches for faster host-to-device copies",
         choices=lambda ctx: [False, True], unavailable=_no_cuda),
    Knob("amp", str, "off", "autocast: off, bf16, or fp16 with GradScaler",
         choices=_amp_choices, value_unavailable=_amp_value, check=_one_of("off", "bf16", "fp16")),
    Knob("compile", str, "off", "torch.compile mode",
         choices=_compile_choices, value_unavailable=_compile_value,
         check=_one_of("off", "default", "reduce-overhead", "max-autotune")),
    Knob("channels_last", bool, False, "NHWC memory format for conv nets",
         choices=lambda ctx: [False, True], unavailable=_no_conv),
    Knob("cudnn_benchmark", bool, False, "torch.backends.cudnn.benchmark (autotune conv algorithms)",
         choices=lambda ctx: [False, True], unavailable=_no_cuda),
    Knob("cudnn_deterministic", bool, False, "torch.backends.cudnn.deterministic",
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
        "amp": "fp16" if cuda else ("bf16" if hw.get("bf16") else "off"),  # AMP with GradScaler on GPU
        "compile": "default",
        "channels_last": True,
        "cudnn_benchmark": True,
        "cudnn_deterministic": False,
    }


SPACE = Space("pytorch", KNOBS, advice=advice)
