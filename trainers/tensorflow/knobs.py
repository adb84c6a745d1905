"""Applying TensorFlow's knobs for real, once, whoever trains: the process settings (threads,
the Keras dtype policy, TF32, XLA auto-clustering, the GPU thread mode), the optimizer's
accumulation and learning rate, and checking which values this machine can apply. The tf.data
knobs are applied by data.build_pipeline."""
from __future__ import annotations

import os
import resource
from typing import Any

import keras
import tensorflow as tf

from knobtune.trainers.common import hostinfo
from knobtune.trainers.common.errors import InvalidKnobs

POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")
LOOPS = ("fit", "custom")
GPU_THREAD_MODES = ("global", "gpu_private", "gpu_shared")
PIPELINE_KNOBS = ("batch_size", "cycle_length", "interleave_parallel_calls", "map_parallel_calls", "prefetch",
                  "deterministic", "cache", "map_parallelization", "private_threadpool_size")
THREAD_MODE_ENV = "TF_GPU_THREAD_MODE"
XLA_FLAGS_ENV = "TF_XLA_FLAGS"
CPU_AUTO_JIT = "--tf_xla_cpu_global_jit"  # auto-clustering clusters CPU ops only with this flag
COMPILE_KNOBS = ("jit_compile", "steps_per_execution", "accumulation_steps")
# What each knob is when nobody set it: TensorFlow's and Keras' own defaults (batch_size: the script's).
DEFAULTS: dict[str, Any] = {
    "accumulation_steps": 1, "cycle_length": 1, "interleave_parallel_calls": 0, "map_parallel_calls": 0,
    "prefetch": 0, "deterministic": True, "cache": False, "jit_compile": "auto", "mixed_precision": "float32",
    "steps_per_execution": 1, "loop": "fit", "intra_op_threads": 0, "tf32": True,
    "xla_auto_clustering": False, "gpu_thread_mode": "global", "map_parallelization": True,
    "private_threadpool_size": 0,
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
    mode = knobs.get("gpu_thread_mode", "global")
    if mode not in GPU_THREAD_MODES:
        out["gpu_thread_mode"] = f"gpu_thread_mode={mode!r}: expected one of {', '.join(GPU_THREAD_MODES)}"
    elif mode != "global" and not hardware.get("gpu"):
        out["gpu_thread_mode"] = f"gpu_thread_mode={mode!r} sets the GPU's launch threads; this process has no GPU"
    threads = knobs.get("private_threadpool_size", 0)
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 0:
        out["private_threadpool_size"] = (f"private_threadpool_size={threads!r}: expected an integer >= 0 "
                                          f"(0: TensorFlow's shared pool)")
    return out


def runtime_started() -> bool:
    """Whether TensorFlow's eager runtime (and with it its devices) has been initialised."""
    from tensorflow.python.eager import context

    current = context.context_safe()
    return current is not None and bool(current._initialized)


def apply_thread_mode(knobs: dict[str, Any], explicit: set[str], gpu: bool) -> str | None:
    """``TF_GPU_THREAD_MODE``, which TensorFlow reads when it creates its GPU devices: set before
    its runtime starts. Returns why it could not be applied (the runtime had started)."""
    mode = knobs.get("gpu_thread_mode", "global")
    if not gpu or "gpu_thread_mode" not in explicit or os.environ.get(THREAD_MODE_ENV, "global") == mode:
        return None
    if runtime_started():
        return (f"gpu_thread_mode={mode!r} was not applied: TensorFlow's runtime had started; call Tuned.load() "
                f"before any TensorFlow operation")
    os.environ[THREAD_MODE_ENV] = mode
    return None


def thread_mode_used(gpu: bool) -> str:
    """The GPU thread mode TensorFlow's devices were created with (read once its runtime runs)."""
    return os.environ.get(THREAD_MODE_ENV, "global") if gpu and runtime_started() else "global"


def devices_listed() -> bool:
    """Whether TensorFlow has listed its devices (which reads TF_XLA_FLAGS, once per process)."""
    from tensorflow.python.eager import context

    current = context.context_safe()
    return current is not None and current._physical_devices is not None


def apply_xla_flags(knobs: dict[str, Any], explicit: set[str]) -> str | None:
    """Auto-clustering clusters CPU ops only with ``--tf_xla_cpu_global_jit`` in TF_XLA_FLAGS,
    which TensorFlow reads when it first lists its devices: set before that (on a GPU machine
    it lets XLA cluster the ops placed on the CPU too). Returns why it could not be set."""
    flags = os.environ.get(XLA_FLAGS_ENV, "").split()
    if "xla_auto_clustering" not in explicit or not knobs.get("xla_auto_clustering") or CPU_AUTO_JIT in flags:
        return None
    if devices_listed():
        return ("xla_auto_clustering=True cannot cluster CPU ops: TensorFlow had read TF_XLA_FLAGS already; call "
                "Tuned.load() before any TensorFlow operation")
    os.environ[XLA_FLAGS_ENV] = " ".join([*flags, CPU_AUTO_JIT])
    return None


def auto_clustering_used(gpu: bool) -> bool:
    """Read back: TensorFlow's jit setting (and on a CPU the flag that lets it cluster CPU ops)."""
    on = tf.config.optimizer.get_jit() == "autoclustering"
    return on and (gpu or CPU_AUTO_JIT in os.environ.get(XLA_FLAGS_ENV, "").split())


def check(knobs: dict[str, Any], hardware: dict[str, Any]) -> None:
    """Raise InvalidKnobs for a value this machine cannot train with (a trial's knobs)."""
    found = problems(knobs, hardware)
    if found:
        raise InvalidKnobs(next(iter(found.values())))


def apply_process(knobs: dict[str, Any], explicit: set[str], gpu: bool) -> dict[str, str]:
    """The process-wide settings that were set (``explicit``): the GPU thread mode, intra-op
    threads, TF32 on a GPU, XLA auto-clustering and the Keras global dtype policy, which layers
    built from now on take. Returns knob -> why it could not be applied (the thread mode and
    threads, once TensorFlow's runtime has started)."""
    out: dict[str, str] = {}
    thread_mode = apply_thread_mode(knobs, explicit, gpu)  # first: before anything could start the runtime
    if thread_mode:
        out["gpu_thread_mode"] = thread_mode
    threads = int(knobs.get("intra_op_threads") or 0) if "intra_op_threads" in explicit else 0
    if threads > 0 and tf.config.threading.get_intra_op_parallelism_threads() != threads:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
        except RuntimeError:
            out["intra_op_threads"] = (f"intra_op_threads={threads} was not applied: TensorFlow's runtime had "
                                       f"started; call Tuned.load() before any TensorFlow operation")
    if gpu and "tf32" in explicit:  # TensorFlow's default on Ampere and newer: TF32 on
        tf.config.experimental.enable_tensor_float_32_execution(bool(knobs["tf32"]))
    if "xla_auto_clustering" in explicit:  # XLA clusters the graphs jit_compile leaves alone
        tf.config.optimizer.set_jit("autoclustering" if knobs["xla_auto_clustering"] else False)
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
