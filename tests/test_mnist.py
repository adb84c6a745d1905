"""The mnist-mlp workload reads real idx files from a directory the user names."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from knobtune.search.launch.runner import run_child
from knobtune.spaces import for_framework
from knobtune.trainers.common import idx
from knobtune.trainers.common.errors import WorkloadError
from knobtune.trainers.common.wire import Burst, Request

CTX = {"hardware": {"cuda": False, "bf16": True, "usable_cores": 2}, "workload": {"batch_size": 64}}


def write_mnist(directory: Path, train: int = 256, test: int = 64) -> None:
    rng = np.random.default_rng(0)
    for split, n in (("train", train), ("test", test)):
        labels = rng.integers(0, 10, n)
        images = np.zeros((n, 28, 28), dtype=np.uint8)
        for i, label in enumerate(labels):  # a learnable pattern: a bright column per class
            images[i, :, 2 + 2 * label] = 255
        idx.write_split(directory, split, images, labels)


def test_idx_round_trip_and_errors(tmp_path: Path):
    write_mnist(tmp_path)
    images, labels = idx.load_split(tmp_path, "train")
    assert images.shape == (256, 28, 28) and labels.shape == (256,)
    bad = tmp_path / "train-images-idx3-ubyte"
    bad.write_bytes(bad.read_bytes()[:-10])
    with pytest.raises(WorkloadError, match="train-images-idx3-ubyte is truncated or corrupt"):
        idx.load_split(tmp_path, "train")
    (tmp_path / "empty").mkdir()
    with pytest.raises(WorkloadError, match="t10k-images-idx3-ubyte"):
        idx.load_split(tmp_path / "empty", "test")


def test_mnist_mlp_burst_learns(tmp_path: Path):
    write_mnist(tmp_path)
    request = Request(workload="mnist-mlp", workload_options={"data_dir": str(tmp_path)},
                      knobs=for_framework("pytorch").defaults(CTX),
                      burst=Burst(train_samples=1280, warmup_samples=128, windows=3))
    child = run_child("pytorch", "burst", request, 120)
    assert child.outcome == "ok", child.failure
    assert child.result.val_accuracy > 0.5  # the column pattern is easy


def test_missing_mnist_dir_is_a_workload_error(tmp_path: Path):
    request = Request(workload="mnist-mlp", workload_options={"data_dir": str(tmp_path / "absent")})
    child = run_child("pytorch", "probe", request, 120)
    assert child.outcome == "error" and "is not a directory" in child.failure
