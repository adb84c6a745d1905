"""The built-in PyTorch workloads: digits-mlp, digits-cnn, mnist-mlp."""
from __future__ import annotations

from typing import Callable

from trainers.common import digits, idx
from trainers.pytorch import models
from trainers.pytorch.data import ArrayImages, PngDigits
from trainers.pytorch.workload import Workload


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


def mnist_mlp(data_dir: str, limit: int | None = None) -> Workload:
    """The MLP on real MNIST idx files in ``data_dir`` (train-* for training, t10k-* held out)."""
    train_x, train_y, test_x, test_y = idx.load_train_test(data_dir, limit)
    return Workload(
        name="mnist-mlp",
        build_model=models.mlp,
        train_dataset=ArrayImages(train_x, train_y, augment=True),
        eval_dataset=ArrayImages(test_x, test_y, augment=False),
    )


WORKLOADS: dict[str, Callable[..., Workload]] = {
    "digits-mlp": digits_mlp,
    "digits-cnn": digits_cnn,
    "mnist-mlp": mnist_mlp,
}
