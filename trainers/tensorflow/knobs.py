"""Applying TensorFlow's knobs that a call applies together, for real, whoever trains: the
optimizer's accumulation and learning rate (kt.compile), and checking which values this machine
can apply. The tf.data knobs are applied by data.build_pipeline. A knob applied on its own
(threads, the Keras dtype policy, TF32, XLA auto-clustering, the GPU thread mode) is applied, and
every knob read back, by its definition in spaces/tensorflow.py."""
from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import keras
import tensorflow as tf

from knobtune.spaces.tensorflow import CPU_AUTO_JIT, SPACE, THREAD_MODE_ENV, XLA_FLAGS_ENV
from knobtune.trainers.common import hostinfo
from knobtune.trainers.common.errors import InvalidKnobs
from knobtune.trainers.common.handling import UNREAD, Handlers, Handling

POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")
PIPELINE_KNOBS = SPACE.applied_by("dataset")
COMPILE_KNOBS = SPACE.applied_by("compile")
# What each knob is when nobody set it: TensorFlow's and Keras' own defaults (batch_size: the
# script's; jit_compile: Keras' "auto", on with a GPU).
DEFAULTS: dict[str, Any] = {**{k.name: k.default for k in SPACE.knobs if k.name != "batch_size"}, "jit_compile": "auto"}


def problems(knobs: dict[str, Any], hardware: dict[str, Any]) -> dict[str, str]:
    """Knob -> why this machine cannot apply its value (empty when all apply): each knob's
    ``check`` and ``problem`` (spaces/tensorflow.py) on ``hardware`` (env.hardware())."""
    return SPACE.problems(knobs, hardware)


def check(knobs: dict[str, Any], hardware: dict[str, Any]) -> None:
    """Raise InvalidKnobs for a value this machine cannot train with (a trial's knobs)."""
    found = problems(knobs, hardware)
    if found:
        raise InvalidKnobs(next(iter(found.values())))


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
    try:  # (a variable under MirroredStrategy has no float(): its value does)
        return float(rate.numpy() if hasattr(rate, "numpy") else rate) if rate is not None else None
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


def rejected(exc: tf.errors.OpError, knobs: dict[str, Any],
             names: tuple[str, ...] = ("jit_compile", "mixed_precision", "steps_per_execution", "loop"),
             ) -> InvalidKnobs:
    """A combination TensorFlow refused to run (XLA on an op it cannot compile ...), as invalid
    (``names``: the knobs that made it)."""
    chosen = ", ".join(f"{k}={knobs[k]!r}" for k in names if k in knobs)
    return InvalidKnobs(f"TensorFlow rejected this combination ({chosen}): {exc.message.splitlines()[0]}")


# ----------------------------------------------------------------- applied on their own, read back
# Each knob's child side (its declaration: spaces/tensorflow.py): how a knob that acts on its own is
# applied, and how every knob is read back from what the trial trained with.


@dataclass(frozen=True)
class Trained:
    """What a TensorFlow child applied the knobs to, as their ``environ``, ``apply`` and ``read``
    see it (TensorFlow objects typed Any: the engine imports this module, never TensorFlow)."""

    knobs: Mapping[str, Any]       # as requested, the framework defaults where none was
    gpu: bool | None = None        # None: not known yet (before TensorFlow lists its devices)
    pipeline: Mapping[str, Any] | None = None  # the tf.data knobs read back from the pipeline trained on
    model: Any = None
    custom: bool = False           # trained by knobtune's custom loop
    step: Any = None               # the script's own step (loops.StepFunction), when it trains with kt.step
    optimizer: Any = None          # the optimizer kt.optimizer prepared for that step
    strategy: Any = None           # the MirroredStrategy of a data-parallel run (None: one replica)
    replicas: int = 1              # the replicas this process trains (Tuned decides: its role, trial or export)


def runtime_started() -> bool:
    """Whether TensorFlow's eager runtime (and with it its devices) has been initialised."""
    from tensorflow.python.eager import context

    current = context.context_safe()
    return current is not None and bool(current._initialized)


def _devices_listed() -> bool:
    """Whether TensorFlow has listed its devices (which reads TF_XLA_FLAGS, once per process)."""
    from tensorflow.python.eager import context

    current = context.context_safe()
    return current is not None and current._physical_devices is not None


def _from_pipeline(name: str) -> Callable[[Trained], Any]:
    return lambda t: UNREAD if t.pipeline is None else t.pipeline[name]


def _from_compiled(read: Callable[[Any], Any]) -> Callable[[Trained], Any]:
    return lambda t: read(t.model) if t.model is not None and getattr(t.model, "compiled", False) else UNREAD


def _accumulation_used(model: Any) -> int:
    return accumulation(model.optimizer)


def _from_step(read: Callable[[Any], Any], compiled: Callable[[Any], Any]) -> Callable[[Trained], Any]:
    """Read from the script's own step (kt.step) when it trains with one, else from the compiled model."""
    from_model = _from_compiled(compiled)
    return lambda t: read(t.step) if t.step is not None else from_model(t)


def _step_accumulation(t: Trained) -> Any:
    if t.step is None:
        return _from_compiled(_accumulation_used)(t)
    return accumulation(t.optimizer) if t.optimizer is not None else UNREAD


def _start_strategy(value: Any, t: Trained) -> None:
    """A data-parallel process's MirroredStrategy with this all-reduce, set as the process's (it
    starts TensorFlow's runtime: the knob is declared last, after the thread knobs)."""
    if t.replicas > 1:
        from knobtune.trainers.tensorflow import distributed

        distributed.start(t.replicas, value)


def _cross_device_ops_used(t: Trained) -> Any:
    """The all-reduce the strategy sums gradients with (its class, read back)."""
    if t.strategy is None:
        return UNREAD
    from knobtune.trainers.tensorflow import distributed

    return distributed.read_back(t.strategy)["cross_device_ops"]


def _set_policy(value: Any, t: Trained) -> None:
    """The Keras global dtype policy, which layers built from now on take."""
    import keras

    keras.mixed_precision.set_global_policy(value)


def _policy_used(t: Trained) -> str:
    import keras

    return t.model.dtype_policy.name if t.model is not None else keras.mixed_precision.global_policy().name


def _set_threads(value: Any, t: Trained) -> str | None:
    import tensorflow as tf

    threads = int(value or 0)
    if threads > 0 and tf.config.threading.get_intra_op_parallelism_threads() != threads:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
        except RuntimeError:
            return (f"intra_op_threads={threads} was not applied: TensorFlow's runtime had started; call "
                    f"Tuned.load() before any TensorFlow operation")
    return None


def _threads_used(t: Trained) -> Any:
    import tensorflow as tf

    return t.knobs["intra_op_threads"] and tf.config.threading.get_intra_op_parallelism_threads()


def _set_tf32(value: Any, t: Trained) -> None:
    import tensorflow as tf

    if t.gpu:  # TensorFlow's default on Ampere and newer: TF32 on
        tf.config.experimental.enable_tensor_float_32_execution(bool(value))


def _tf32_used(t: Trained) -> bool:
    import tensorflow as tf

    return bool(t.gpu) and bool(tf.config.experimental.tensor_float_32_execution_enabled())  # none on a CPU


def _set_xla_flags(value: Any, t: Trained) -> str | None:
    """Auto-clustering clusters CPU ops only with ``--tf_xla_cpu_global_jit`` in TF_XLA_FLAGS,
    which TensorFlow reads when it first lists its devices: set before that (on a GPU machine
    it lets XLA cluster the ops placed on the CPU too). Returns why it could not be set."""
    flags = os.environ.get(XLA_FLAGS_ENV, "").split()
    if not value or CPU_AUTO_JIT in flags:
        return None
    if _devices_listed():
        return ("xla_auto_clustering=True cannot cluster CPU ops: TensorFlow had read TF_XLA_FLAGS already; call "
                "Tuned.load() before any TensorFlow operation")
    os.environ[XLA_FLAGS_ENV] = " ".join([*flags, CPU_AUTO_JIT])
    return None


def _set_jit(value: Any, t: Trained) -> None:
    """XLA clusters the graphs jit_compile leaves alone."""
    import tensorflow as tf

    tf.config.optimizer.set_jit("autoclustering" if value else False)


def _auto_clustering_used(t: Trained) -> bool:
    """Read back: TensorFlow's jit setting (and on a CPU the flag that lets it cluster CPU ops)."""
    import tensorflow as tf

    on = tf.config.optimizer.get_jit() == "autoclustering"
    return on and (bool(t.gpu) or CPU_AUTO_JIT in os.environ.get(XLA_FLAGS_ENV, "").split())


def _set_thread_mode(value: Any, t: Trained) -> str | None:
    """``TF_GPU_THREAD_MODE``, which TensorFlow reads when it creates its GPU devices: set before
    its runtime starts. Returns why it could not be applied (the runtime had started)."""
    if not t.gpu or os.environ.get(THREAD_MODE_ENV, "global") == value:
        return None
    if runtime_started():
        return (f"gpu_thread_mode={value!r} was not applied: TensorFlow's runtime had started; call Tuned.load() "
                f"before any TensorFlow operation")
    os.environ[THREAD_MODE_ENV] = value
    return None


def _thread_mode_used(t: Trained) -> str:
    """The GPU thread mode TensorFlow's devices were created with (read once its runtime runs)."""
    return os.environ.get(THREAD_MODE_ENV, "global") if t.gpu and runtime_started() else "global"


HANDLERS = Handlers(SPACE, {
    "batch_size": Handling(read=_from_pipeline("batch_size")),
    "accumulation_steps": Handling(read=_step_accumulation),
    "jit_compile": Handling(read=_from_step(lambda step: step.jit_used, lambda model: bool(model.jit_compile))),
    "mixed_precision": Handling(apply=_set_policy, read=_policy_used),
    "steps_per_execution": Handling(read=_from_step(lambda step: step.per_call,
                                                    lambda model: int(model.steps_per_execution))),
    "loop": Handling(read=lambda t: "custom" if t.custom else "fit"),
    "intra_op_threads": Handling(apply=_set_threads, read=_threads_used),
    "tf32": Handling(apply=_set_tf32, read=_tf32_used),
    "xla_auto_clustering": Handling(environ=_set_xla_flags, apply=_set_jit, read=_auto_clustering_used),
    "gpu_thread_mode": Handling(apply=_set_thread_mode, read=_thread_mode_used),
    "cross_device_ops": Handling(apply=_start_strategy, read=_cross_device_ops_used),
    **{name: Handling(read=_from_pipeline(name)) for name in PIPELINE_KNOBS if name != "batch_size"},
})
