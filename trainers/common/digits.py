"""scikit-learn's handwritten digits, upscaled to 28x28 and written once as PNG files.

The 1797 real 8x8 images ship inside scikit-learn, so nothing is downloaded. They are upscaled
to MNIST's 28x28 and stored as individual PNG files so that a training input pipeline has real
decoding work to do (which is what makes DataLoader workers and tf.data parallelism matter).
The held-out split is fixed (stratified, seed 0) and identical for every trial and framework.
"""
from __future__ import annotations

import io
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from knobtune.trainers.common.paths import cache_dir

VERSION = "digits-28-v1"
SIZE = 28
VAL_FRACTION = 0.2


@dataclass(frozen=True)
class Sample:
    path: Path
    label: int


@dataclass(frozen=True)
class DigitsFiles:
    root: Path
    train: list[Sample]
    val: list[Sample]


def _render(image_8x8) -> bytes:
    import numpy as np
    from PIL import Image

    pixels = (np.asarray(image_8x8, dtype=np.float32) * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    image = Image.fromarray(pixels, "L").resize((SIZE, SIZE), Image.BILINEAR)
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def _write(root: Path) -> None:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    indices = list(range(len(digits.target)))
    train_idx, val_idx = train_test_split(
        indices, test_size=VAL_FRACTION, random_state=0, stratify=digits.target
    )
    index: dict[str, list[list[object]]] = {"train": [], "val": []}
    for split, chosen in (("train", sorted(train_idx)), ("val", sorted(val_idx))):
        (root / split).mkdir(parents=True)
        for i in chosen:
            label = int(digits.target[i])
            rel = f"{split}/{i:04d}_{label}.png"
            (root / rel).write_bytes(_render(digits.images[i]))
            index[split].append([rel, label])
    (root / "index.json").write_text(json.dumps(index))


def prepare(base: Path | None = None) -> DigitsFiles:
    """Return the PNG files, writing them first if this cache has none (safe under concurrency)."""
    base = base or cache_dir()
    root = base / VERSION
    if not (root / "index.json").exists():
        base.mkdir(parents=True, exist_ok=True)
        staging = base / f".{VERSION}.tmp-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        _write(staging)
        try:
            os.rename(staging, root)
        except OSError:  # another process finished first; its files are identical
            shutil.rmtree(staging, ignore_errors=True)
    index = json.loads((root / "index.json").read_text())
    return DigitsFiles(
        root=root,
        train=[Sample(root / rel, int(label)) for rel, label in index["train"]],
        val=[Sample(root / rel, int(label)) for rel, label in index["val"]],
    )
