"""charlm's data the TensorFlow way: the corpus windows as TFRecord shards of raw bytes, parsed
into (inputs, next-token targets) pairs."""
from __future__ import annotations

from typing import Callable

import numpy as np
import tensorflow as tf

from knobtune.trainers.common.text import Corpus
from knobtune.trainers.tensorflow.data import SHARDS, write_shards


def window_shards(corpus: Corpus) -> list[str]:
    """The corpus' training windows as TFRecord shards beside its arrays (written once)."""
    return write_shards(corpus.root / f"tfrecord-{SHARDS}", ((row.tobytes(), 0) for row in corpus.train), key="raw")


def parse_window(context: int) -> Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor]]:
    """A parser of one window record -> (``context`` int32 inputs, ``context`` int64 targets)."""
    def parse(serialized: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        parsed = tf.io.parse_single_example(serialized, {
            "raw": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)})
        row = tf.reshape(tf.io.decode_raw(parsed["raw"], tf.uint8), (context + 1,))
        return tf.cast(row[:-1], tf.int32), tf.cast(row[1:], tf.int64)

    return parse


def eval_pairs(corpus: Corpus) -> tuple[np.ndarray, np.ndarray]:
    """The held-out windows as (inputs, targets) arrays."""
    return corpus.val[:, :-1].astype(np.int32), corpus.val[:, 1:].astype(np.int64)
