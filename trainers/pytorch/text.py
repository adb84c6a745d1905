"""charlm's data the PyTorch way: windows of tokens as (inputs, next-token targets) pairs, and the
loss over every position."""
from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F
from torch.utils.data import Dataset


class TokenWindows(Dataset):
    """Rows of ``context + 1`` tokens; sample i is (row[:-1], row[1:]) as int64 tensors."""

    def __init__(self, rows: np.ndarray) -> None:
        self.rows = torch.from_numpy(rows.astype(np.int64))

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        row = self.rows[index]
        return row[:-1], row[1:]


def token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of (batch, length, vocab) logits against (batch, length) targets."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
