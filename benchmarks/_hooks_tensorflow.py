"""The hooks' cost for a hand-written TensorFlow step (kt.optimizer + @kt.step + kt.batches): see
benchmarks/trainer_libraries.py, which runs this file in a process of its own.

    .venv/bin/python benchmarks/_hooks_tensorflow.py tf-step [--rounds 12] [--steps 600]
"""
from __future__ import annotations

import sys
from typing import Callable

from _hooks import WARMUP_STEPS, Clock, main


def tf_step_round(steps: int) -> tuple[Callable[[], float], Callable[[], float]]:
    import keras
    import numpy as np
    import tensorflow as tf

    import own_step_tensorflow as job
    from knobtune.tensorflow import Tuned

    batch = 64
    rng = np.random.default_rng(0)
    images = rng.random((batch * (WARMUP_STEPS + steps), 28, 28, 1), dtype=np.float32)
    labels = rng.integers(0, 10, len(images))
    data = tf.data.Dataset.from_tensor_slices((images, labels)).batch(batch, drop_remainder=True).cache()
    for _ in data:  # the cache filled before any round
        pass
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def run(wrapped: bool) -> float:
        keras.utils.set_random_seed(0)
        model = job.build_model()
        kt = Tuned.load() if wrapped else None
        optimizer = keras.optimizers.Adam(1e-3)
        if kt is not None:
            optimizer = kt.optimizer(model, optimizer)
        else:
            optimizer.build(model.trainable_variables)

        def train_step(inputs: tf.Tensor, targets: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                loss = loss_fn(targets, model(inputs, training=True))
                scaled = optimizer.scale_loss(loss)
            gradients = tape.gradient(scaled, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            return loss

        step = kt.step(train_step) if kt is not None else tf.function(train_step)
        clock = Clock(batch)
        for inputs, targets in (kt.batches(data) if kt is not None else data):
            loss = step(inputs, targets)
            float(loss)  # (the same sync in both: a step's end)
            clock.tick()
        return clock.rate()

    return (lambda: run(False)), (lambda: run(True))


if __name__ == "__main__":
    # (a step of about a millisecond: 60 of them time less than the machine's jitter)
    sys.exit(main({"tf-step": ("TensorFlow @kt.step", tf_step_round, 600)}))
