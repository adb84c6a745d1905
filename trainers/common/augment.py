"""The per-sample augmentation both frameworks apply to training images (framework-free, Pillow)."""
from __future__ import annotations

import random

from PIL import Image

MAX_ROTATION_DEG = 10.0
MAX_SHIFT_PX = 2.0


def random_affine(image: Image.Image, rng: random.Random | None = None) -> Image.Image:
    """Rotate by up to +-10 degrees and shift by up to +-2 pixels, bilinear, black fill."""
    r = rng or random
    return image.rotate(
        r.uniform(-MAX_ROTATION_DEG, MAX_ROTATION_DEG),
        resample=Image.BILINEAR,
        translate=(r.uniform(-MAX_SHIFT_PX, MAX_SHIFT_PX), r.uniform(-MAX_SHIFT_PX, MAX_SHIFT_PX)),
    )
