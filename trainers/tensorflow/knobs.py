"""Applying TensorFlow's knobs that a call applies together, for real, whoever trains: the
optimizer's accumulation and learning rate (kt.compile), and checking which values this machine
can apply. The tf.data knobs are applied by data.build_pipeline. A knob applied on its own
(threads, the Keras dtype policy, TF32, XLA auto-clustering, the GPU thread mode) is applied, and
every knob read back, by its definition in spaces/tensorflow.py."""
from __future__ import annotations

import resource
from typing import Any

import keras
import tensorflow as tf

from knobtune.spaces.tensorflow import SPACE
from knobtune.trainers.common import hostinfo
from knobtune.trainers.common.errors import InvalidKnobs

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
