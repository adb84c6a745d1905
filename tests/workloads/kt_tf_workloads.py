"""TensorFlow test workloads: tiny real digits shards, and faults injected on purpose."""
from __future__ import annotations

from pathlib import Path

import keras
import tensorflow as tf

from knobtune.tensorflow import Workload
from knobtune.trainers.common import digits
from knobtune.trainers.common.paths import cache_dir
from knobtune.trainers.tensorflow.builtin import _eval_arrays
from knobtune.trainers.tensorflow.data import parse_png, random_affine, write_shards
from knobtune.trainers.tensorflow.models import mlp


def tiny(train: int = 320, val: int = 160, batch_size: int = 32, shards: int = 4,
         build_model=mlp) -> Workload:
    """The digits MLP on a slice of the real PNG files, as ``shards`` TFRecord files."""
    files = digits.prepare()
    chosen = files.train[:train]
    root = cache_dir() / f"kt-tiny-tf-{train}-{shards}"
    paths = write_shards(root, ((Path(s.path).read_bytes(), s.label) for s in chosen), key="png", shards=shards)
    return Workload(build_model=build_model, train_files=paths, parse_fn=parse_png, augment_fn=random_affine,
                    eval_data=_eval_arrays(files.val[:val]), batch_size=batch_size, train_size=len(chosen))


class Explode(keras.layers.Layer):
    """Identity until ``after`` training calls, then multiplies by inf."""

    def __init__(self, after: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.after = after

    def build(self, input_shape) -> None:
        self.calls = self.add_weight(shape=(), initializer="zeros", dtype="int64", trainable=False, name="calls")

    def call(self, x, training=None):
        if training:
            self.calls.assign_add(1)
        factor = tf.where(self.calls > self.after, float("inf"), 1.0)
        return x * tf.cast(factor, x.dtype)


def diverge(after: int = 5) -> Workload:
    def build() -> keras.Model:
        base = mlp()
        return keras.Sequential([keras.Input((28, 28, 1)), base, Explode(after, dtype="float32")])

    return tiny(build_model=build)


class NoXla(keras.layers.Layer):
    """A layer with a Python op inside: XLA cannot compile it."""

    def call(self, x):
        out = tf.py_function(lambda t: t, [x], Tout=x.dtype)
        out.set_shape(x.shape)
        return out

    def compute_output_shape(self, input_shape):
        return input_shape


def no_xla() -> Workload:
    def build() -> keras.Model:
        return keras.Sequential([keras.Input((28, 28, 1)), mlp(), NoXla(dtype="float32")])

    return tiny(build_model=build)


def corrupt() -> Workload:
    """One of its TFRecord files is garbage."""
    workload = tiny(shards=2, train=96)
    bad = Path(workload.train_files[0]).with_name("corrupt.tfrecord")
    bad.write_bytes(b"this is not a TFRecord file" * 10)
    workload.train_files = [workload.train_files[1], str(bad)]
    workload.train_size = None
    return workload


def missing() -> Workload:
    workload = tiny()
    workload.train_files = workload.train_files + ["/nonexistent/shard-9.tfrecord"]
    return workload




def bounded_shuffle(shuffle_buffer: int = 100) -> Workload:
    """The tiny digits with the record count left to knobtune and a small shuffle buffer."""
    workload = tiny()
    workload.train_size = None
    workload.shuffle_buffer = shuffle_buffer
    return workload


def oom_in_eval() -> Workload:
    """Evaluation runs out of memory (the float32 twin's forward raises ResourceExhaustedError)."""

    class Exhausted(keras.layers.Layer):
        def call(self, x, training=None):
            if training is False and tf.executing_eagerly():  # the evaluation's float32 twin
                raise tf.errors.ResourceExhaustedError(None, None, "simulated: OOM when allocating tensor")
            return x

    def build() -> keras.Model:
        return keras.Sequential([keras.Input((28, 28, 1)), mlp(), Exhausted(dtype="float32")])

    return tiny(build_model=build)


def slow_input(per_sample: float = 0.002, warmup_cost: float = 0.0, batch_size: int = 16) -> Workload:
    """Input-bound: parsing a record sleeps ``per_sample`` seconds (the rate is set by the map's
    parallel calls, not by this machine's load); an optional slow first training step."""
    import time

    def slow_parse(serialized: tf.Tensor):
        image, label = parse_png(serialized)
        image = tf.numpy_function(lambda x: (time.sleep(per_sample), x)[1], [image], tf.float32)
        return tf.ensure_shape(image, (28, 28, 1)), label

    calls = {"n": 0}

    def first_call_sleeps(x):
        calls["n"] += 1
        if calls["n"] == 1 and warmup_cost:
            time.sleep(warmup_cost)
        return x

    class Warm(keras.layers.Layer):
        def call(self, x, training=None):
            if training:
                out = tf.numpy_function(first_call_sleeps, [x], x.dtype)
                out.set_shape(x.shape)
                return out
            return x

        def compute_output_shape(self, input_shape):
            return input_shape

    def build() -> keras.Model:
        return keras.Sequential([keras.Input((28, 28, 1)), Warm(dtype="float32"), mlp()])

    workload = tiny(train=1437, batch_size=batch_size, build_model=build)
    workload.parse_fn = slow_parse
    return workload


class ExplodeOnOneReplica(keras.layers.Layer):
    """Identity until ``after`` training calls, then inf on MirroredStrategy's second replica only
    (the first replica's outputs stay finite for that step)."""

    def __init__(self, after: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.after = after

    def build(self, input_shape) -> None:
        self.calls = self.add_weight(shape=(), initializer="zeros", dtype="int64", trainable=False, name="calls",
                                     aggregation="only_first_replica")

    def call(self, x, training=None):
        if not training:
            return x
        self.calls.assign_add(1)
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        factor = tf.where((self.calls > self.after) & tf.equal(replica, 1), float("inf"), 1.0)
        return x * tf.cast(factor, x.dtype)


def diverge_on_one_replica(after: int = 5) -> Workload:
    def build() -> keras.Model:
        return keras.Sequential([keras.Input((28, 28, 1)), mlp(), ExplodeOnOneReplica(after, dtype="float32")])

    return tiny(build_model=build)
