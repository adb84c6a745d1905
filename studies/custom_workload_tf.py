"""An example TensorFlow user workload: your own TFRecord files, parse function, model and metric.

knobtune imports ``studies.custom_workload_tf:build`` from the directory you run it in (here the
repository root) and calls ``build(**[workload] options)``. It must return a
``knobtune.tensorflow.Workload``; the tf.data pipeline around ``parse_fn`` (interleave, map
parallelism, cache, shuffle, batch, prefetch), the compile settings, the loop, the timing, the NaN
guard and the evaluation are knobtune's. So that the example runs anywhere, it writes its
TFRecord files once from scikit-learn's 8x8 digits; point ``data_dir`` at your own shards instead.
"""
from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from knobtune.tensorflow import Workload

FEATURES = {"pixels": tf.io.FixedLenFeature([64], tf.float32), "label": tf.io.FixedLenFeature([], tf.int64)}


def _write_example_shards(directory: Path, shards: int = 4) -> tuple[list[str], tuple[np.ndarray, np.ndarray]]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images.reshape(-1, 64) / 16.0).astype(np.float32)
    x_train, x_val, y_train, y_val = train_test_split(x, digits.target, test_size=0.2, random_state=0,
                                                      stratify=digits.target)
    directory.mkdir(parents=True, exist_ok=True)
    paths = [str(directory / f"digits8-{i}-of-{shards}.tfrecord") for i in range(shards)]
    if not all(Path(p).exists() for p in paths):
        writers = [tf.io.TFRecordWriter(p) for p in paths]
        for i, (pixels, label) in enumerate(zip(x_train, y_train)):
            example = tf.train.Example(features=tf.train.Features(feature={
                "pixels": tf.train.Feature(float_list=tf.train.FloatList(value=pixels)),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)]))}))
            writers[i % shards].write(example.SerializeToString())
        for w in writers:
            w.close()
    return paths, (x_val, y_val.astype(np.int64))


def parse(serialized: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    record = tf.io.parse_single_example(serialized, FEATURES)
    return record["pixels"], record["label"]


def build(width: int = 128, lr: float = 0.05, data_dir: str | None = None) -> Workload:
    """A 64-width-10 MLP on 8x8 digits from TFRecord files, trained with SGD + momentum."""
    from knobtune.trainers.common.paths import cache_dir

    directory = Path(data_dir).expanduser() if data_dir else cache_dir() / "example-digits8"
    files, eval_data = _write_example_shards(directory)

    def model() -> keras.Model:
        return keras.Sequential([keras.Input((64,)), keras.layers.Dense(width, activation="relu"),
                                 keras.layers.Dense(10, dtype="float32")])

    def optimizer(**kwargs) -> keras.optimizers.Optimizer:
        return keras.optimizers.SGD(learning_rate=lr, momentum=0.9, **kwargs)

    def top1(outputs: np.ndarray, targets: np.ndarray) -> float:
        return float(np.mean(outputs.argmax(axis=1) == targets))

    return Workload(build_model=model, train_files=files, parse_fn=parse, eval_data=eval_data,
                    build_optimizer=optimizer, metric=top1, batch_size=32, name="custom-digits8-tf")
