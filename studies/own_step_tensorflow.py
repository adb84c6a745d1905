"""The seed chapter's own TensorFlow training loop (shared/seeds/004, section 3.2.1: a GradientTape
step under ``@tf.function``, and a loop over the dataset calling it), made tunable. Four lines
change, and the step scales its loss for mixed_float16:

    kt = Tuned.load()                                 # 1: the trial's knobs, or $KNOBTUNE_CONFIG;
                                                      #    before the model (it sets the dtype policy)
    optimizer = kt.optimizer(model, keras.optimizers.Adam(args.lr))
                                                      # 2: accumulation; a LossScaleOptimizer under fp16
    @kt.step                                          # 3: in place of @tf.function: XLA, several steps
    def train_step(inputs, labels): ...               #    per call, the NaN guard, its traces counted
    for inputs, labels in kt.batches(train_ds):       # 4: the measured burst, or one pass watched
        loss = train_step(inputs, labels)
    kt.report(val_accuracy=accuracy)                  #    the accuracy, after training

(``kt.dataset`` builds the tf.data pipeline, as in studies/own_loop_keras.py.)

Tune it:         knobtune run studies/own-step-tensorflow.toml
Run the winner:  knobtune export own-step-tensorflow -o best.json
                 KNOBTUNE_CONFIG=best.json python studies/own_step_tensorflow.py --epochs 20

The data: scikit-learn's handwritten digits as 28x28 PNG files on disk, written once into 8
TFRecord shards of PNG bytes, decoded and augmented per sample as a real image pipeline would.
"""
from __future__ import annotations

import argparse
import json

import keras
import tensorflow as tf

from knobtune.tensorflow import Tuned
from knobtune.trainers.common import digits
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
    parser = argparse.ArgumentParser(description="Train an MLP on the digits with a hand-written TensorFlow loop, "
                                                 "tuned by knobtune.")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()

    kt = Tuned.load()
    files = digits.prepare()
    train_ds = kt.dataset(digits_shards(files.train), parse_png, random_affine, batch_size=args.batch_size)
    val_ds = tf.data.Dataset.from_tensor_slices(([str(s.path) for s in files.val], [s.label for s in files.val]))
    val_ds = val_ds.map(load_png).batch(256)

    model = build_model()
    optimizer = kt.optimizer(model, keras.optimizers.Adam(args.lr))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @kt.step
    def train_step(inputs: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            predictions = model(inputs, training=True)
            loss = loss_fn(labels, predictions)
            scaled = optimizer.scale_loss(loss)  # mixed_float16: the LossScaleOptimizer's scale; else the loss
        gradients = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    for epoch in range(args.epochs):
        for inputs, labels in kt.batches(train_ds):
            loss = train_step(inputs, labels)
        accuracy = keras.metrics.SparseCategoricalAccuracy()
        for images, labels in val_ds:
            accuracy.update_state(labels, model(images, training=False))
        print(f"epoch {epoch + 1}: loss {float(loss):.4f}, accuracy {float(accuracy.result()):.3f}", flush=True)
        kt.report(val_accuracy=float(accuracy.result()))  # in a trial, after the burst, this ends the script
    print("knobtune stats: " + json.dumps(kt.stats()), flush=True)


if __name__ == "__main__":
    main()
