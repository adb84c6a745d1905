"""The built-in PyTorch workloads: digits-mlp, digits-cnn, digits-resnet, mnist-mlp, charlm."""
from __future__ import annotations

from functools import partial
from typing import Callable

from knobtune.trainers.common import digits, idx, text
from knobtune.trainers.common.factory import check_charlm, require_ints
from knobtune.trainers.pytorch import models
from knobtune.trainers.pytorch.data import ArrayImages, PngDigits
from knobtune.trainers.pytorch.text import TokenWindows, token_cross_entropy
from knobtune.trainers.pytorch.workload import Workload


def _digits(name: str, build_model: Callable[[], object]) -> Workload:
    files = digits.prepare()
    return Workload(
        name=name,
        build_model=build_model,  # type: ignore[arg-type]
        train_dataset=PngDigits(files.train, augment=True),
        eval_dataset=PngDigits(files.val, augment=False),
    )


def digits_mlp() -> Workload:
    """The seed's MLP on scikit-learn's digits as 28x28 PNG files."""
    return _digits("digits-mlp", models.mlp)


def digits_cnn() -> Workload:
    """A small conv net on the same PNG digits."""
    return _digits("digits-cnn", models.cnn)


def digits_resnet(width: int = 16, blocks: int = 1) -> Workload:
    """A small residual CNN with BatchNorm on the same digits at 32x32 (``width`` channels in the
    first stage, ``blocks`` residual blocks per stage)."""
    require_ints("digits-resnet", 1, width=width, blocks=blocks)
    return _digits("digits-resnet", partial(models.resnet, width, blocks))


def mnist_mlp(data_dir: str, limit: int | None = None) -> Workload:
    """The MLP on real MNIST idx files in ``data_dir`` (train-* for training, t10k-* held out)."""
    train_x, train_y, test_x, test_y = idx.load_train_test(data_dir, limit)
    return Workload(
        name="mnist-mlp",
        build_model=models.mlp,
        train_dataset=ArrayImages(train_x, train_y, augment=True),
        eval_dataset=ArrayImages(test_x, test_y, augment=False),
    )


def charlm(context: int = 64, depth: int = 2, width: int = 64, heads: int = 4, train_chars: int = 1_000_000,
           eval_windows: int = 256, batch_size: int = 32) -> Workload:
    """A GPT-style character LM on the standard library's source (trainers.common.text): one sample
    is a window of ``context`` characters; the metric is next-character accuracy over the held-out
    files' windows."""
    check_charlm(context, depth, width, heads)
    corpus = text.prepare(context, train_chars, eval_windows)
    return Workload(
        name="charlm",
        build_model=partial(models.charlm, text.VOCAB, context, depth, width, heads),
        train_dataset=TokenWindows(corpus.train),
        eval_dataset=TokenWindows(corpus.val),
        loss_fn=token_cross_entropy,
        batch_size=batch_size,
    )


WORKLOADS: dict[str, Callable[..., Workload]] = {
    "digits-mlp": digits_mlp,
    "digits-cnn": digits_cnn,
    "digits-resnet": digits_resnet,
    "mnist-mlp": mnist_mlp,
    "charlm": charlm,
}
