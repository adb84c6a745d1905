"""PyTorch's part of the fingerprint, and the hardware facts the knob space needs."""
from __future__ import annotations

from typing import Any

import torch

from knobtune.trainers.common import hostinfo
from knobtune.trainers.pytorch.knobs import loader_in_order


def fingerprint() -> dict[str, Any]:
    """Host facts plus torch, CUDA, cuDNN and GPU details (initialises CUDA: child only)."""
    cuda = torch.cuda.is_available()
    gpus = []
    if cuda:
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            gpus.append(
                {
                    "name": props.name,
                    "memory_mb": props.total_memory // (1024 * 1024),
                    "capability": f"{props.major}.{props.minor}",
                }
            )
    cudnn = torch.backends.cudnn.version() if cuda and torch.backends.cudnn.is_available() else None
    return {
        **hostinfo.host(),
        "framework": "pytorch",
        "torch": torch.__version__,
        "cuda_available": cuda,
        "cuda_version": torch.version.cuda,
        "cudnn_version": cudnn,
        "gpus": gpus,
        "hardware": hardware(cuda),
    }


def hardware(cuda: bool | None = None) -> dict[str, Any]:
    """What spaces.pytorch decides on: device, bf16/fp16 support (and whether bf16 is done in
    hardware), usable cores, and what this torch offers (the DataLoader's in_order)."""
    cuda = torch.cuda.is_available() if cuda is None else cuda
    if cuda:
        bf16 = bool(torch.cuda.is_bf16_supported(including_emulation=False))  # emulated bf16 is slow
        # TF32 tensor cores: Ampere (compute capability 8.0) and newer
        tf32 = torch.cuda.get_device_capability(0)[0] >= 8
    else:
        bf16 = True  # CPU autocast supports bfloat16 everywhere; whether it is faster is measured
        tf32 = False
    return {
        "device": "cuda" if cuda else "cpu",
        "cuda": cuda,
        "bf16": bf16,
        # the advice asks for bf16 only where it is not emulated (the search still offers it)
        "bf16_native": bf16 if cuda else hostinfo.cpu_bf16_native(),
        "fp16": cuda,
        "tf32": tf32,
        "usable_cores": hostinfo.usable_cores(),
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "loader_in_order": loader_in_order(),
    }
