"""A user's own hand-written TensorFlow loop for the tests (a GradientTape step wrapped by kt.step,
a loop over kt.batches), on a slice of the real digits as TFRecord shards. Flags break it in the
ways the tests need: ``--retrace`` (the step gets a Python number that changes every call: traced
again on every call), ``--uses-batch`` (the loop casts the batch itself before the step, which
several steps per call cannot allow)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import keras
import tensorflow as tf

from knobtune.tensorflow import Tuned
from knobtune.trainers.common import digits
from knobtune.trainers.common.paths import cache_dir
from knobtune.trainers.tensorflow.builtin import _eval_arrays
from knobtune.trainers.tensorflow.data import parse_png, random_affine, write_shards
from knobtune.trainers.tensorflow.models import mlp


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--retrace", action="store_true")
    p.add_argument("--uses-batch", action="store_true")
    args = p.parse_args()

    kt = Tuned.load()
    files = digits.prepare()
    chosen = files.train[:320]
    shards = write_shards(cache_dir() / "kt-tf-script-320-4",
                          ((Path(s.path).read_bytes(), s.label) for s in chosen), key="png", shards=4)
    ds = kt.dataset(shards, parse_png, random_affine, batch_size=32, train_size=len(chosen))
    model = mlp()
    optimizer = kt.optimizer(model, keras.optimizers.Adam(1e-3))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @kt.step
    def train_step(x: tf.Tensor, y: tf.Tensor, weight: float = 1.0) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True)) * weight
        grads = tape.gradient(optimizer.scale_loss(loss), model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    calls = 0
    for _ in range(args.epochs):
        for x, y in kt.batches(ds):
            calls += 1
            if args.uses_batch:
                x = tf.cast(x, tf.float32)
            loss = train_step(x, y, 1.0 + calls * 1e-9) if args.retrace else train_step(x, y)
        print(f"loss {float(loss):.4f}", flush=True)
        inputs, labels = _eval_arrays(files.val[:160])
        kt.report(val_accuracy=float((model.predict(inputs, verbose=0).argmax(axis=1) == labels).mean()))
    print("stats " + json.dumps(kt.stats()), flush=True)


if __name__ == "__main__":
    main()
