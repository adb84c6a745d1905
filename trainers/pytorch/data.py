"""Datasets of the built-in workloads (PNG files decoded per sample, MNIST idx arrays), and the
sampler that makes the data order and augmentation stream the same whatever ``num_workers`` is."""
from __future__ import annotations

import random
from typing import Any, Iterator, Sequence

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset, Sampler

from knobtune.trainers.common.augment import random_affine
from knobtune.trainers.common.digits import Sample
from knobtune.trainers.common.errors import WorkloadError


class Draw(int):
    """A dataset index that carries the seed of this draw's augmentation.

    It is an ``int`` (any Dataset indexes with it as usual); a Dataset that augments seeds a
    ``random.Random(index.seed)`` from it instead of using the process-global RNG, whose state
    depends on which worker process loads the sample. So the augmentation stream is the same
    with 0, 1 or 8 workers.
    """

    seed: int

    def __new__(cls, index: int, seed: int) -> "Draw":
        obj = super().__new__(cls, index)
        obj.seed = seed
        return obj

    def __reduce__(self) -> tuple[Any, ...]:  # sent to worker processes by pickle
        return (Draw, (int(self), self.seed))


def draw_rng(index: Any) -> random.Random | None:
    """The RNG for this draw's augmentation (None for a plain index: the global RNG)."""
    seed = getattr(index, "seed", None)
    return random.Random(seed) if seed is not None else None


class SeededSampler(Sampler[int]):
    """Shuffled indices, epoch after epoch, each a ``Draw`` whose seed depends only on the study
    seed, the epoch and the position: the order and augmentation never depend on the workers."""

    def __init__(self, size: int, seed: int, rank: int = 0, ranks: int = 1) -> None:
        self.size, self.seed, self.epoch = size, seed, 0
        self.rank, self.ranks = rank, ranks  # a data-parallel rank reads every ranks-th draw, from its own

    def __len__(self) -> int:
        return self.size // self.ranks  # (the same for every rank: the tail that does not divide is left out)

    def __iter__(self) -> Iterator[int]:
        epoch = self.epoch
        self.epoch += 1
        generator = torch.Generator().manual_seed((self.seed << 20) + epoch)
        order = torch.randperm(self.size, generator=generator).tolist()
        base = (self.seed << 64) | (epoch << 32)
        for position in range(self.rank, len(self) * self.ranks, self.ranks):
            yield Draw(order[position], base | position)


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
            image = random_affine(image, draw_rng(index))
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
            image = random_affine(image, draw_rng(index))
        return _to_tensor(image), int(self.labels[index])


