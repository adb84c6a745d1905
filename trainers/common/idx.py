"""Reader for the MNIST idx file format (framework-free). Files may be gzip-compressed."""
from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

from knobtune.trainers.common.errors import WorkloadError

IMAGES_MAGIC = 0x00000803
LABELS_MAGIC = 0x00000801
SPLITS = {"train": "train", "test": "t10k"}


def _open(path: Path) -> bytes:
    if path.suffix == ".gz":
        with gzip.open(path, "rb") as f:
            return f.read()
    return path.read_bytes()


def _find(directory: Path, stem: str) -> Path:
    for candidate in (directory / stem, directory / f"{stem}.gz"):
        if candidate.exists():
            return candidate
    raise WorkloadError(f"MNIST file {directory / stem} (or {stem}.gz) not found")


def read_images(path: Path) -> np.ndarray:
    data = _open(path)
    if len(data) < 16:
        raise WorkloadError(f"{path} is not an idx image file: {len(data)} bytes, expected a 16-byte header")
    magic, count, rows, cols = struct.unpack(">IIII", data[:16])
    if magic != IMAGES_MAGIC:
        raise WorkloadError(f"{path} is not an idx image file: magic {magic:#010x}, expected {IMAGES_MAGIC:#010x}")
    expected = 16 + count * rows * cols
    if len(data) != expected:
        raise WorkloadError(f"{path} is truncated or corrupt: {len(data)} bytes, expected {expected}")
    return np.frombuffer(data, dtype=np.uint8, offset=16).reshape(count, rows, cols)


def read_labels(path: Path) -> np.ndarray:
    data = _open(path)
    if len(data) < 8:
        raise WorkloadError(f"{path} is not an idx label file: {len(data)} bytes, expected an 8-byte header")
    magic, count = struct.unpack(">II", data[:8])
    if magic != LABELS_MAGIC:
        raise WorkloadError(f"{path} is not an idx label file: magic {magic:#010x}, expected {LABELS_MAGIC:#010x}")
    if len(data) != 8 + count:
        raise WorkloadError(f"{path} is truncated or corrupt: {len(data)} bytes, expected {8 + count}")
    return np.frombuffer(data, dtype=np.uint8, offset=8).astype(np.int64)


def load_split(directory: str | Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, 28, 28) uint8 and labels (N,) of MNIST's ``train`` or ``test`` split."""
    directory = Path(directory).expanduser()
    if not directory.is_dir():
        raise WorkloadError(f"MNIST data_dir {directory} is not a directory")
    prefix = SPLITS[split]
    images_path = _find(directory, f"{prefix}-images-idx3-ubyte")
    labels_path = _find(directory, f"{prefix}-labels-idx1-ubyte")
    images, labels = read_images(images_path), read_labels(labels_path)
    if len(images) != len(labels):
        raise WorkloadError(f"{images_path} has {len(images)} images but {labels_path} has {len(labels)} labels")
    return images, labels


def load_train_test(directory: str | Path, limit: int | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """MNIST's train split (its first ``limit`` samples when given) and its t10k split."""
    train_x, train_y = load_split(directory, "train")
    test_x, test_y = load_split(directory, "test")
    if limit is not None:
        train_x, train_y = train_x[:limit], train_y[:limit]
    return train_x, train_y, test_x, test_y


def write_split(directory: str | Path, split: str, images: np.ndarray, labels: np.ndarray) -> None:
    """Write idx files (used by tests and by users converting their own data)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    prefix = SPLITS[split]
    images = np.ascontiguousarray(images, dtype=np.uint8)
    count, rows, cols = images.shape
    (directory / f"{prefix}-images-idx3-ubyte").write_bytes(
        struct.pack(">IIII", IMAGES_MAGIC, count, rows, cols) + images.tobytes()
    )
    (directory / f"{prefix}-labels-idx1-ubyte").write_bytes(
        struct.pack(">II", LABELS_MAGIC, len(labels)) + np.asarray(labels, dtype=np.uint8).tobytes()
    )
