"""What a TensorFlow trial trains: the Workload contract, the built-ins, and user factories."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

from knobtune.trainers.common.errors import WorkloadError
from knobtune.trainers.common.factory import call_factory, resolve


def accuracy(outputs: np.ndarray, targets: np.ndarray) -> float:
    """Top-1 accuracy of logits (classes on the last axis) against integer targets, counted per
    element: per sample for a classifier, per position for a sequence model."""
    return float(np.mean(np.argmax(outputs, axis=-1) == targets))


def adam(lr: float = 1e-3) -> Callable[..., keras.optimizers.Optimizer]:
    def build(**kwargs: Any) -> keras.optimizers.Optimizer:
        return keras.optimizers.Adam(learning_rate=lr, **kwargs)

    return build


def _sparse_ce() -> keras.losses.Loss:
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@dataclass
class Workload:
    """A training job knobtune can tune, the TensorFlow way.

    ``train_files`` are TFRecord files (several, so interleave's ``cycle_length`` means something);
    ``parse_fn(serialized)`` turns one record into an ``(input, target)`` pair of tensors and
    ``augment_fn(input, target)``, optional, runs after the cache point, so augmentation stays
    fresh every epoch. ``eval_data`` is the held-out ``(inputs, targets)`` as NumPy arrays.
    ``build_optimizer(**kwargs)`` must pass its keyword arguments (``gradient_accumulation_steps``)
    to the Keras optimizer. ``metric(outputs, targets)`` scores the held-out set in [0, 1].
    ``shuffle_buffer`` bounds the shuffle buffer (records); ``eval_batch_size`` bounds the
    held-out evaluation's batches (default: the trial's batch size).
    """

    build_model: Callable[[], keras.Model]
    train_files: list[str]
    parse_fn: Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor]]
    eval_data: tuple[np.ndarray, np.ndarray]
    augment_fn: Callable[[tf.Tensor, tf.Tensor], tuple[tf.Tensor, tf.Tensor]] | None = None
    loss: Any = field(default_factory=_sparse_ce)
    build_optimizer: Callable[..., keras.optimizers.Optimizer] = field(default_factory=adam)
    metric: Callable[[np.ndarray, np.ndarray], float] = accuracy
    batch_size: int = 64
    train_size: int | None = None  # records in train_files; counted once per study (the probe) when None
    shuffle_buffer: int = 10_000  # the buffer holds decoded samples: bounded, whatever the data's size
    eval_batch_size: int | None = None
    name: str = "custom"


def _builtins() -> dict[str, Callable[..., Workload]]:
    from knobtune.trainers.tensorflow import builtin

    return builtin.WORKLOADS


def load(name: str, options: dict[str, Any] | None = None) -> Workload:
    """Build the workload called ``name``: a built-in, or ``package.module:factory``."""
    factory = resolve(name, _builtins(), "tensorflow")
    workload = call_factory(factory, name, options or {}, Workload, "knobtune.tensorflow.Workload")
    missing = [f for f in workload.train_files if not tf.io.gfile.exists(f)]
    if missing:
        raise WorkloadError(f"workload {name!r}: TFRecord file {missing[0]} does not exist"
                            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    if not workload.train_files:
        raise WorkloadError(f"workload {name!r} has no train_files")
    return workload
