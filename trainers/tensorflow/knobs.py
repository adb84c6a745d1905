"""Applying TensorFlow's knobs for real, once, whoever trains: the process settings (threads,
the Keras dtype policy, TF32), the optimizer's accumulation and learning rate, and checking
which values this machine can apply. The tf.data knobs are applied by data.build_pipeline."""
from __future__ import annotations

import resource
from typing import Any

import keras
import tensorflow as tf

from trainers.common import hostinfo
from trainers.common.errors import InvalidKnobs

POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")
LOOPS = ("fit", "custom")
PIPELINE_KNOBS = ("batch_size", "cycle_length", "interleave_parallel_calls", "map_parallel_calls", "prefetch",
                  "deterministic", "cache")
COMPILE_KNOBS = ("jit_compile", "steps_per_execution", "accumulation_steps")
# What each knob is when nobody set it: TensorFlow's and Keras' own defaults (batch_size: the script's).
DEFAULTS: dict[str, Any] = {
    "accumulation_steps": 1, "cycle_length": 1, "interleave_parallel_calls": 0, "map_parallel_calls": 0,
    "prefetch": 0, "deterministic": True, "cache": False, "jit_compile": "auto", "mixed_precision": "float32",
    "steps_per_execution": 1, "loop": "fit", "intra_op_threads": 0, "tf32": True,
}


def problems(knobs: dict[str, Any], hardware: dict[str, Any]) -> dict[str, str]:
    """Knob -> why this machine cannot apply its value (empty when all apply)."""
    out: dict[str, str] = {}
    policy = knobs.get("mixed_precision", "float32")
    if policy not in POLICIES:
        out["mixed_precision"] = f"mixed_precision={policy!r}: expected one of {', '.join(POLICIES)}"
    elif policy == "mixed_float16" and not hardware.get("gpu"):
        out["mixed_precision"] = ("mixed_precision='mixed_float16' (with loss scaling) needs a GPU; this process "
                                  "has none")
    elif policy == "mixed_bfloat16" and not hardware.get("bf16"):
        out["mixed_precision"] = "mixed_precision='mixed_bfloat16' is not supported by this GPU (before Ampere)"
    loop = knobs.get("loop", "fit")
    if loop not in LOOPS:
        out["loop"] = f"loop={loop!r}: expected 'fit' or 'custom'"
    for name in ("accumulation_steps", "steps_per_execution"):
        value = knobs.get(name, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            out[name] = f"{name}={value!r}: expected an integer >= 1"
    return out


def check(knobs: dict[str, Any], hardware: dict[str, Any]) -> None:
    """Raise InvalidKnobs for a value this machine cannot train with (a trial's knobs)."""
    found = problems(knobs, hardware)
    if found:
        raise InvalidKnobs(next(iter(found.values())))


def apply_process(knobs: dict[str, Any], explicit: set[str], gpu: bool) -> dict[str, str]:
    """The process-wide settings that were set (``explicit``): intra-op threads, TF32 on a GPU,
    and the Keras global dtype policy, which layers built from now on take. Returns knob ->
    why it could not be applied (threads, once TensorFlow's runtime has started)."""
    out: dict[str, str] = {}
    threads = int(knobs.get("intra_op_threads") or 0) if "intra_op_threads" in explicit else 0
    if threads > 0 and tf.config.threading.get_intra_op_parallelism_threads() != threads:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
        except RuntimeError:
            out["intra_op_threads"] = (f"intra_op_threads={threads} was not applied: TensorFlow's runtime had "
                                       f"started; call Tuned.load() before any TensorFlow operation")
    if gpu and "tf32" in explicit:  # TensorFlow's default on Ampere and newer: TF32 on
        tf.config.experimental.enable_tensor_float_32_execution(bool(knobs["tf32"]))
    if "mixed_precision" in explicit:
        keras.mixed_precision.set_global_policy(knobs["mixed_precision"])
    return out


def inner(optimizer: Any) -> Any:
    """The optimizer under a LossScaleOptimizer (itself otherwise)."""
    return getattr(optimizer, "inner_optimizer", optimizer)


def accumulation(optimizer: Any) -> int:
    """Micro-batches per optimizer step, read back from the (inner) optimizer."""
    return int(getattr(inner(optimizer), "gradient_accumulation_steps", None) or 1)


def prepare_optimizer(optimizer: Any, accumulation_steps: int | None, lr_scale: float) -> keras.optimizers.Optimizer:
    """``optimizer`` (an instance or a name Keras knows) with ``accumulation_steps`` micro-batches
    per step (None: as it is) and its learning rate times ``lr_scale``. It must not be built yet."""
    optimizer = keras.optimizers.get(optimizer)
    if accumulation_steps is not None and accumulation(optimizer) != accumulation_steps:
        if optimizer.built:
            raise InvalidKnobs(f"accumulation_steps={accumulation_steps}: the optimizer has already been built "
                               f"(used); pass kt.compile a fresh one")
        # Keras reads this when it builds the optimizer (accumulators) and at every apply
        optimizer.gradient_accumulation_steps = accumulation_steps if accumulation_steps > 1 else None
    if lr_scale != 1.0:  # lr_scaling: the learning rate rescaled with the effective batch
        rate = optimizer.learning_rate
        if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
            raise InvalidKnobs(f"lr_scale={lr_scale:g} needs a constant learning rate; this optimizer follows a "
                               f"{type(rate).__name__} (set [study] lr_scaling = \"none\")")
        optimizer.learning_rate = float(rate) * lr_scale
    return optimizer


def learning_rate(optimizer: Any) -> float | None:
    rate = inner(optimizer).learning_rate if optimizer is not None else None
    try:
        return float(rate) if rate is not None else None
    except (TypeError, ValueError):  # a schedule
        return None


def memory_limit_mb(gpu: bool) -> float | None:
    """What the peak is judged against: the host memory this process may grow into on a CPU
    (trainers/common/hostinfo.memory_room_mb); None on a GPU, whose total TensorFlow does not
    report (the headroom guard then does not apply)."""
    return None if gpu else hostinfo.memory_room_mb()


def peak_memory_mb(gpu: bool) -> float:
    if gpu:
        return tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def rejected(exc: tf.errors.OpError, knobs: dict[str, Any]) -> InvalidKnobs:
    """A combination TensorFlow refused to run (XLA on an op it cannot compile ...), as invalid."""
    chosen = ", ".join(f"{k}={knobs[k]!r}" for k in ("jit_compile", "mixed_precision", "steps_per_execution", "loop")
                       if k in knobs)
    return InvalidKnobs(f"TensorFlow rejected this combination ({chosen}): {exc.message.splitlines()[0]}")
