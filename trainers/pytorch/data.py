"""Datasets of the built-in workloads: PNG files decoded per sample, MNIST idx arrays."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from trainers.common.augment import random_affine
from trainers.common.digits import Sample
from trainers.common.errors import WorkloadError


def _to_tensor(image: Image.Image) -> torch.Tensor:
    # Scale to [0, 1], as the TensorFlow twin does, so the two compare fairly.
    return torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).unsqueeze(0)


class PngDigits(Dataset):
    """One PNG file per sample, decoded with Pillow; random affine augmentation when ``augment``."""

    def __init__(self, samples: Sequence[Sample], augment: bool) -> None:
        self.samples = list(samples)
        self.augment = augment

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        sample = self.samples[index]
        try:
            with Image.open(sample.path) as image:
                image = image.convert("L")
        except (OSError, SyntaxError) as exc:
            raise WorkloadError(f"cannot decode training image {sample.path}: {exc}") from None
        if self.augment:
            image = random_affine(image)
        return _to_tensor(image), sample.label


class ArrayImages(Dataset):
    """In-memory uint8 images (N, H, W) with integer labels; augmentation as for PNG digits."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, augment: bool) -> None:
        self.images, self.labels, self.augment = images, labels, augment

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = Image.fromarray(self.images[index], "L")
        if self.augment:
            image = random_affine(image)
        return _to_tensor(image), int(self.labels[index])


