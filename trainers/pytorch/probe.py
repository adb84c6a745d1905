"""The probe: fingerprint, hardware and a description of the workload (prepares its data)."""
from __future__ import annotations

from typing import Any

import torch

from trainers.common.child import probe_handler
from trainers.pytorch import env
from trainers.pytorch.workload import load


def describe(request: dict[str, Any]) -> dict[str, Any]:
    workload = load(request["workload"], request.get("workload_options"))
    model = workload.build_model()
    inputs, _ = workload.train_dataset[0]
    shape = list(inputs.shape) if isinstance(inputs, torch.Tensor) else None
    return {
        "name": workload.name,
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_samples": len(workload.train_dataset),  # type: ignore[arg-type]
        "eval_samples": len(workload.eval_dataset),  # type: ignore[arg-type]
        "sample_shape": shape,
        "conv": any(isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)) for m in model.modules()),
        "batch_size": workload.batch_size,
    }


run = probe_handler(env.fingerprint, describe)
