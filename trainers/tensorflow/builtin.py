"""The built-in TensorFlow workloads: digits-mlp, digits-cnn, digits-resnet, mnist-mlp, charlm (twins of the
PyTorch ones)."""
from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Callable

import keras
import numpy as np
from PIL import Image

from knobtune.trainers.common import digits, idx, text
from knobtune.trainers.common.factory import check_charlm, require_ints
from knobtune.trainers.tensorflow import models
from knobtune.trainers.tensorflow.data import digits_shards, mnist_shards, parse_png, parse_raw28, random_affine
from knobtune.trainers.tensorflow.text import eval_pairs, parse_window, window_shards
from knobtune.trainers.tensorflow.workload import Workload


def _eval_arrays(samples: list[digits.Sample]) -> tuple[np.ndarray, np.ndarray]:
    images = np.stack([np.asarray(Image.open(s.path).convert("L"), dtype=np.float32) / 255.0 for s in samples])
    return images[..., np.newaxis], np.array([s.label for s in samples], dtype=np.int64)


def _digits(name: str, build_model: Callable[[], keras.Model]) -> Workload:
    files = digits.prepare()
    return Workload(
        name=name,
        build_model=build_model,
        train_files=digits_shards(files.train),
        parse_fn=parse_png,
        augment_fn=random_affine,
        eval_data=_eval_arrays(files.val),
        train_size=len(files.train),
    )


def digits_mlp() -> Workload:
    """The seed's MLP on scikit-learn's digits as PNG bytes in TFRecord shards."""
    return _digits("digits-mlp", models.mlp)


def digits_cnn() -> Workload:
    """A small conv net on the same shards."""
    return _digits("digits-cnn", models.cnn)


def digits_resnet(width: int = 16, blocks: int = 1) -> Workload:
    """A small residual CNN with BatchNorm on the same shards at 32x32."""
    require_ints("digits-resnet", 1, width=width, blocks=blocks)
    return _digits("digits-resnet", partial(models.resnet, width, blocks))


def mnist_mlp(data_dir: str, limit: int | None = None) -> Workload:
    """The MLP on real MNIST idx files in ``data_dir`` (train-* written to TFRecord shards once)."""
    train_x, train_y, test_x, test_y = idx.load_train_test(data_dir, limit)
    return Workload(
        name="mnist-mlp",
        build_model=models.mlp,
        train_files=mnist_shards(Path(data_dir).expanduser(), train_x, train_y),
        parse_fn=parse_raw28,
        augment_fn=random_affine,
        eval_data=(test_x[..., np.newaxis].astype(np.float32) / 255.0, test_y),
        train_size=len(train_y),
    )


def charlm(context: int = 64, depth: int = 2, width: int = 64, heads: int = 4, train_chars: int = 1_000_000,
           eval_windows: int = 256, batch_size: int = 32) -> Workload:
    """The GPT-style character LM on the standard library's source, windows in TFRecord shards."""
    check_charlm(context, depth, width, heads)
    corpus = text.prepare(context, train_chars, eval_windows)
    return Workload(
        name="charlm",
        build_model=partial(models.charlm, text.VOCAB, context, depth, width, heads),
        train_files=window_shards(corpus),
        parse_fn=parse_window(context),
        eval_data=eval_pairs(corpus),
        train_size=len(corpus.train),
        batch_size=batch_size,
    )


WORKLOADS: dict[str, Callable[..., Workload]] = {
    "digits-mlp": digits_mlp,
    "digits-cnn": digits_cnn,
    "digits-resnet": digits_resnet,
    "mnist-mlp": mnist_mlp,
    "charlm": charlm,
}
