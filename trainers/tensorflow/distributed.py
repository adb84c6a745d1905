"""Data-parallel training in one TensorFlow process: ``tf.distribute.MirroredStrategy`` over the
trial's devices (its GPUs; on a machine without one, as many logical CPU devices), set as the
process's strategy when ``Tuned`` is made, so the model the script builds afterwards has mirrored
variables and ``model.fit`` splits each global batch between the replicas. The knob
``cross_device_ops`` chooses how the replicas' gradients are summed; the probe tries each choice
(and XLA, gradient accumulation, several steps per call) on a tiny model here, so a study offers
only what runs.
"""
from __future__ import annotations

import os
import re
from typing import Any

import keras
import tensorflow as tf

from knobtune.spaces.tensorflow import CROSS_DEVICE_OPS
from knobtune.trainers.common.errors import WorkloadError
from knobtune.trainers.tensorflow.knobs import runtime_started

STRATEGY = "MirroredStrategy"
# a strategy's all-reduce class -> the knob's value (MirroredStrategy's own is CollectiveAllReduce)
_KNOB_VALUE = {**{cls: name for name, cls in CROSS_DEVICE_OPS.items() if cls}, "CollectiveAllReduce": "collective"}


def devices(n: int) -> list[str]:
    """``n`` devices for the replicas: the first ``n`` visible GPUs, or on a machine without one
    ``n`` logical CPU devices (made before TensorFlow's runtime starts). WorkloadError when there
    are fewer GPUs, or the runtime started before the CPU could be divided."""
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        if len(gpus) < n:
            raise WorkloadError(f"{n} replicas need {n} GPUs; this process sees {len(gpus)} "
                                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
        return [f"/gpu:{i}" for i in range(n)]
    cpu = tf.config.list_physical_devices("CPU")[0]
    present = tf.config.get_logical_device_configuration(cpu) or []
    if len(present) < n:
        if runtime_started():
            raise WorkloadError(f"{n} replicas on this CPU need {n} logical CPU devices, made before TensorFlow's "
                                f"runtime starts: call Tuned.load() before any TensorFlow operation")
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)
    return [f"/cpu:{i}" for i in range(n)]


def make(n: int, cross_device_ops: str = "collective") -> tf.distribute.MirroredStrategy:
    """A MirroredStrategy over ``n`` devices (``devices``) with the ``cross_device_ops`` knob's all-reduce."""
    if cross_device_ops not in CROSS_DEVICE_OPS:
        raise WorkloadError(f"cross_device_ops={cross_device_ops!r}: expected one of {', '.join(CROSS_DEVICE_OPS)}")
    cls = CROSS_DEVICE_OPS[cross_device_ops]
    return tf.distribute.MirroredStrategy(devices(n), cross_device_ops=getattr(tf.distribute, cls)() if cls else None)


def start(n: int, cross_device_ops: str = "collective") -> tf.distribute.MirroredStrategy:
    """``make``, then set as this process's strategy: what the script builds from now on is mirrored."""
    strategy = make(n, cross_device_ops)
    tf.distribute.experimental_set_strategy(strategy)
    return strategy


def read_back(strategy: tf.distribute.Strategy) -> dict[str, Any]:
    """The strategy as it reports itself: its replicas, their devices, and its all-reduce."""
    ops = getattr(strategy.extended, "_cross_device_ops", None)
    return {"strategy": type(strategy).__name__, "replicas": int(strategy.num_replicas_in_sync),
            "devices": list(strategy.extended.worker_devices),
            "cross_device_ops": _KNOB_VALUE.get(type(ops).__name__, type(ops).__name__) if ops is not None else None}


_GENERIC = re.compile(r"^(Graph execution error|Detected at node|Exception encountered|File |Arguments received|\[\[|"
                      r"\d+ (root|successful|derived) |Cf\. |\W*$)")


def _reason(exc: BaseException) -> str:
    """The line of TensorFlow's long error text that says what went wrong (its first sentence)."""
    text = re.sub(r"\x1b\[[0-9;]*m| \(defined @ [^)]*\)", "", getattr(exc, "message", None) or str(exc))
    for line in text.splitlines():
        line = re.sub(r"^\(\d+\) [A-Z_]+:\s*", "", line.strip())
        if line and not _GENERIC.match(line):
            return line.split(". ")[0].rstrip(".")[:240]
    return type(exc).__name__


def _fit(strategy: tf.distribute.Strategy, steps_per_execution: int = 1, jit_compile: bool = False,
         accumulation: int | None = None) -> str | None:
    """Why a tiny model's ``fit`` under ``strategy`` with these settings fails here (None: it ran),
    with the trial's NaN guard among its metrics."""
    from knobtune.trainers.tensorflow.loops import FirstNonFinite

    n = strategy.num_replicas_in_sync
    try:
        with strategy.scope():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
            model.compile(keras.optimizers.SGD(0.01, gradient_accumulation_steps=accumulation), "mse",
                          metrics=[FirstNonFinite()], steps_per_execution=steps_per_execution,
                          jit_compile=jit_compile)
        data = tf.data.Dataset.from_tensors((tf.ones([4]), tf.ones([2]))).repeat().batch(2 * n, drop_remainder=True)
        model.fit(data, epochs=1, steps_per_epoch=2 * steps_per_execution, verbose=0)
        return None
    except (tf.errors.OpError, RuntimeError, ValueError, TypeError) as exc:
        return _reason(exc)


def capabilities(n: int) -> dict[str, Any]:
    """What a data-parallel trial of ``n`` replicas can use here (the probe asks, before the
    script builds anything): the devices; the ``cross_device_ops`` that train a tiny model, and
    why each cannot also run several steps per call (None: it can); why XLA or gradient accumulation cannot (None:
    they can), each tried with MirroredStrategy's own all-reduce."""
    names = devices(n)
    ops: list[str] = []
    multi_step: dict[str, str | None] = {}  # why each cannot run several steps per call (None: it can)
    refused: dict[str, str] = {}
    for name in CROSS_DEVICE_OPS:
        try:
            strategy = make(n, name)
        except (tf.errors.OpError, RuntimeError, ValueError) as exc:
            refused[name] = _reason(exc)
            continue
        why = _fit(strategy)
        if why is not None:
            refused[name] = why
            continue
        ops.append(name)
        multi_step[name] = _fit(strategy, steps_per_execution=2)
    if not ops:
        raise WorkloadError(f"MirroredStrategy over {', '.join(names)} trains nothing here: "
                            + "; ".join(f"{k}: {v}" for k, v in refused.items()))
    own = make(n, ops[0])
    return {"strategy": STRATEGY, "devices": names, "cross_device_ops": ops, "multi_step_ops": multi_step,
            "refused_ops": refused, "jit_compile": _fit(own, jit_compile=True),
            "accumulation": _fit(own, accumulation=2)}
