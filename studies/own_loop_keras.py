"""An ordinary Keras training script: a tf.data pipeline over TFRecord shards (interleave, parse,
augment, shuffle, batch), ``model.compile``, ``model.fit`` for some epochs, an evaluation at the
end. Five lines make knobtune able to tune it and to run the winner in production:

    kt = Tuned.load()                                 # 1: the trial's knobs, or $KNOBTUNE_CONFIG;
                                                      #    before the model (it sets the dtype policy)
    train_ds = kt.dataset(shards, parse_png, random_affine,
                          batch_size=args.batch_size) # 2: interleave, parallel maps, cache, prefetch
    kt.compile(model, optimizer=..., loss=...,
               metrics=["accuracy"])                  # 3: XLA, steps_per_execution, accumulation
    kt.fit(model, train_ds, epochs=args.epochs)       # 4: the measured burst, or watched in production
    kt.report(val_accuracy=accuracy)                  # 5: the accuracy, after training

Tune it:         knobtune run studies/own-loop-keras.toml
Run the winner:  knobtune export own-loop-keras -o best.json
                 KNOBTUNE_CONFIG=best.json python studies/own_loop_keras.py --epochs 20

The data: scikit-learn's handwritten digits as 28x28 PNG files on disk, written once into 8
TFRecord shards of PNG bytes (what knobtune's built-in TensorFlow workloads read), decoded and
augmented per sample as a real image pipeline would.
"""
from __future__ import annotations

import argparse
import json

import keras
import tensorflow as tf

from knobtune.trainers.common import digits
from knobtune.tensorflow import Tuned
from knobtune.trainers.tensorflow.data import digits_shards, parse_png, random_affine


def build_model() -> keras.Model:
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Flatten(),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dropout(0.3),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10, dtype="float32"),  # logits in float32 under a mixed-precision policy
    ])


def load_png(path: tf.Tensor, label: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    image = tf.io.decode_png(tf.io.read_file(path), channels=1)
    return tf.cast(image, tf.float32) / 255.0, label


def main() -> None:
    parser = argparse.ArgumentParser(description="Train an MLP on the digits with Keras, tuned by knobtune.")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()

    kt = Tuned.load()
    files = digits.prepare()
    shards = digits_shards(files.train)
    train_ds = kt.dataset(shards, parse_png, random_affine, batch_size=args.batch_size)
    val_ds = tf.data.Dataset.from_tensor_slices(([str(s.path) for s in files.val], [s.label for s in files.val]))
    val_ds = val_ds.map(load_png).batch(256)

    model = build_model()
    kt.compile(model, optimizer=keras.optimizers.Adam(args.lr),
               loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    kt.fit(model, train_ds, epochs=args.epochs, verbose=2)
    accuracy = float(model.evaluate(val_ds, verbose=0, return_dict=True)["accuracy"])
    print(f"accuracy {accuracy:.3f}", flush=True)
    kt.report(val_accuracy=accuracy)
    print("knobtune stats: " + json.dumps(kt.stats()), flush=True)


if __name__ == "__main__":
    main()
