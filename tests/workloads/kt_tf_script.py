"""A user's own Keras training script for the tests, on a slice of the real digits as TFRecord
shards. Flags break it in the ways the tests need: ``--raise-before`` (fails before its first
kt.fit), ``--no-fit`` (never calls kt.fit), ``--no-report`` (never reports its accuracy),
``--no-compile`` (compiles with model.compile, not kt.compile), ``--own-pipeline`` (builds its
own tf.data pipeline, not with kt.dataset), ``--model-first`` (builds its model before Tuned.load())."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from knobtune.tensorflow import Tuned
from knobtune.trainers.common import digits
from knobtune.trainers.common.paths import cache_dir
from knobtune.trainers.tensorflow.builtin import _eval_arrays
from knobtune.trainers.tensorflow.data import parse_png, random_affine, write_shards
from knobtune.trainers.tensorflow.models import mlp


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--raise-before", action="store_true")
    p.add_argument("--no-fit", action="store_true")
    p.add_argument("--no-report", action="store_true")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--own-pipeline", action="store_true")
    p.add_argument("--model-first", action="store_true")
    args = p.parse_args()

    early = mlp() if args.model_first else None
    kt = Tuned.load()
    files = digits.prepare()
    chosen = files.train[:320]
    shards = write_shards(cache_dir() / "kt-tf-script-320-4",
                          ((Path(s.path).read_bytes(), s.label) for s in chosen), key="png", shards=4)
    if args.raise_before:
        raise RuntimeError("the user's data set could not be opened")
    if args.own_pipeline:
        ds = tf.data.TFRecordDataset(shards).map(parse_png).shuffle(320).batch(args.batch_size)
    else:
        ds = kt.dataset(shards, parse_png, random_affine, batch_size=args.batch_size, train_size=len(chosen))
    model = early or mlp()
    optimizer = keras.optimizers.Adam(1e-3)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if args.no_compile:
        model.compile(optimizer=optimizer, loss=loss)
    else:
        kt.compile(model, optimizer=optimizer, loss=loss)
    done = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: print(f"epoch {epoch + 1} done",
                                                                                  flush=True))
    if not args.no_fit:
        kt.fit(model, ds, epochs=args.epochs, callbacks=[done], verbose=0)
    x, y = _eval_arrays(files.val[:160])
    accuracy = float(np.mean(np.argmax(model.predict(x, verbose=0), axis=1) == y))
    if not args.no_report:
        kt.report(val_accuracy=accuracy)
    print("stats " + json.dumps(kt.stats()), flush=True)


if __name__ == "__main__":
    main()
