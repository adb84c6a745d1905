"""TensorFlow's knobs (the seeds' tf.data and tf.function advice, made searchable).

Parallelism knobs take a number or "autotune" (tf.data.AUTOTUNE); 0 means sequential
(``num_parallel_calls`` unset) and, for ``prefetch``, no prefetch at all.
"""
from __future__ import annotations

from typing import Any

from knobtune.spaces.knobs import (Context, Knob, Space, accumulation_knob, batch_size_knob, core_counts, fits_cores, hardware,
                          one_of, positive, threads_knob)

AUTOTUNE = "autotune"
_hw = hardware


def _parallelism(value: Any) -> str | None:
    if value == AUTOTUNE or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return None
    return f"expected 0 (sequential), a number of parallel calls or {AUTOTUNE!r}, got {value!r}"


def _cycle(value: Any) -> str | None:
    if value == AUTOTUNE or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return None
    return f"expected a number of files >= 1 or {AUTOTUNE!r}, got {value!r}"


def _parallel_choices(ctx: Context) -> list[Any]:
    return core_counts(ctx) + [AUTOTUNE]


def _precision_choices(ctx: Context) -> list[str]:
    hw = _hw(ctx)
    return ["float32"] + (["mixed_bfloat16"] if hw.get("bf16") else []) + (["mixed_float16"] if hw.get("gpu") else [])


def _precision_value(value: Any, ctx: Context) -> str | None:
    if value == "mixed_float16" and not _hw(ctx).get("gpu"):
        return "mixed_float16 (with loss scaling) needs a GPU"
    if value == "mixed_bfloat16" and not _hw(ctx).get("bf16"):
        return "this device does not support bfloat16"
    return None


def _no_tf32(ctx: Context) -> str | None:
    if not _hw(ctx).get("gpu"):
        return "TF32 is a GPU tensor-core format; this machine has no GPU"
    return None if _hw(ctx).get("tf32") else "this GPU has no TF32 tensor cores (before Ampere)"


def _mixed(values: Any) -> str | None:
    policy = values.get("mixed_precision", "float32")
    return None if policy == "float32" else f"mixed_precision={policy} computes in 16 bits: fp32 precision does not apply"


def _no_gpu(ctx: Context) -> str | None:
    return None if _hw(ctx).get("gpu") else "sets how TensorFlow launches GPU kernels; this machine has no GPU"


def _whole_step_compiled(values: Any) -> str | None:
    if values.get("jit_compile"):
        return "jit_compile=True compiles the whole train step with XLA: auto-clustering has nothing left to cluster"
    return None


def _maps_parallel(values: Any) -> str | None:
    calls = values.get("map_parallel_calls", 0)
    return None if not calls else (f"map_parallel_calls={calls!r} already runs the maps in parallel: "
                                   f"map_parallelization only rewrites sequential maps")


def _nothing_parallel(values: Any) -> str | None:
    if any(values.get(k, 0) for k in ("interleave_parallel_calls", "map_parallel_calls", "prefetch")):
        return None
    if values.get("map_parallelization", True):
        return None  # the sequential stateless maps run on the pool
    return "no tf.data op runs in parallel or ahead (no parallel calls, no prefetch): no thread pool to size"


def _non_negative(value: Any) -> str | None:
    return None if value >= 0 else f"must be >= 0 (0 = TensorFlow's shared pool), got {value}"


KNOBS = (
    batch_size_knob(),
    accumulation_knob("Keras 3 optimizer gradient_accumulation_steps"),
    Knob("cycle_length", object, 1, "TFRecord files read at once by interleave (or 'autotune')",
         choices=lambda ctx: [1, 2, 4, 8, AUTOTUNE], check=_cycle),
    Knob("interleave_parallel_calls", object, 0, "interleave num_parallel_calls (0 = sequential)",
         choices=_parallel_choices, check=_parallelism),
    Knob("map_parallel_calls", object, 0, "decode/augment map num_parallel_calls (0 = sequential)",
         choices=_parallel_choices, check=_parallelism),
    Knob("prefetch", object, 0, "prefetch buffer after batching, always last (0 = none)",
         choices=lambda ctx: [0, 1, 2, 4, AUTOTUNE], check=_parallelism),
    Knob("deterministic", bool, True, "keep element order under parallelism",
         choices=lambda ctx: [True, False]),
    Knob("cache", bool, False, "cache decoded images in memory after the first epoch (augmentation stays per epoch)",
         choices=lambda ctx: [False, True]),
    Knob("jit_compile", bool, False, "XLA compilation of the train step (Keras' 'auto': on with a GPU)",
         choices=lambda ctx: [False, True], default_in=lambda ctx: bool(_hw(ctx).get("gpu"))),
    Knob("mixed_precision", str, "float32", "Keras dtype policy; mixed_float16 adds a LossScaleOptimizer",
         choices=_precision_choices, value_unavailable=_precision_value,
         check=one_of("float32", "mixed_bfloat16", "mixed_float16")),
    Knob("steps_per_execution", int, 1, "train steps per host call",
         choices=lambda ctx: [1, 2, 4, 8, 16], check=positive),
    Knob("loop", str, "fit", "Keras model.fit, or a custom loop under @tf.function",
         choices=lambda ctx: ["fit", "custom"], check=one_of("fit", "custom")),
    threads_knob("tf.config.threading intra-op threads", "TensorFlow"),
    Knob("tf32", bool, True, "TF32 tensor cores for fp32 matmuls and convolutions (TensorFlow's default on Ampere+)",
         choices=lambda ctx: [True, False], unavailable=_no_tf32, inactive=_mixed),
    Knob("xla_auto_clustering", bool, False,
         "tf.config.optimizer.set_jit: XLA compiles clusters of the graphs jit_compile leaves alone",
         choices=lambda ctx: [False, True], inactive=_whole_step_compiled),
    Knob("gpu_thread_mode", str, "global",
         "TF_GPU_THREAD_MODE: gpu_private gives the GPU its own kernel-launch threads",
         choices=lambda ctx: ["global", "gpu_private"], unavailable=_no_gpu,
         check=one_of("global", "gpu_private", "gpu_shared")),
    Knob("map_parallelization", bool, True, "tf.data Options: run stateless sequential maps in parallel (default on)",
         choices=lambda ctx: [True, False], inactive=_maps_parallel),
    Knob("private_threadpool_size", int, 0, "tf.data Options: the pipeline's own thread pool (0 = the shared pool)",
         choices=core_counts, value_unavailable=fits_cores("threads"), check=_non_negative,
         inactive=_nothing_parallel),
)


def advice(ctx: Context) -> dict[str, Any]:
    """What the seeds tell a TensorFlow user to do by hand (shared/seeds/004_*)."""
    return {
        "cycle_length": 4,                      # "interleave(..., cycle_length=4, num_parallel_calls=AUTOTUNE)"
        "interleave_parallel_calls": AUTOTUNE,
        "map_parallel_calls": AUTOTUNE,         # "map(parse_function, num_parallel_calls=AUTOTUNE)"
        "prefetch": AUTOTUNE,                   # "prefetch last, with AUTOTUNE"
        "loop": "custom",                       # "@tf.function on the training step"
    }


def input_variants(ctx: Context) -> dict[str, dict[str, Any]]:
    return {"all AUTOTUNE": {"cycle_length": AUTOTUNE, "interleave_parallel_calls": AUTOTUNE,
                             "map_parallel_calls": AUTOTUNE, "prefetch": AUTOTUNE}}


SPACE = Space("tensorflow", KNOBS, advice=advice, input_variants=input_variants)
