"""The probe: fingerprint, hardware and a description of the workload (prepares its data), or
of the user's script (run until its first batch)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from knobtune.trainers.common import script
from knobtune.trainers.common.child import probe_handler
from knobtune.trainers.common.errors import WorkloadError
from knobtune.trainers.common.wire import Request
from knobtune.trainers.pytorch import env
from knobtune.trainers.pytorch.knobs import has_conv, optimizer_impls
from knobtune.trainers.pytorch.tuned import for_request
from knobtune.trainers.pytorch.workload import load


def _shape(sample: Any) -> list[int] | None:
    first = next(script.leaves(sample), None)
    return list(first.shape) if isinstance(first, torch.Tensor) else None


def _sized(dataset: Any) -> int | None:
    try:
        return len(dataset)
    except TypeError:  # an IterableDataset without __len__
        return None


def describe_script(request: Request) -> dict[str, Any]:
    """Run the script until its first ``kt.batches``: what it builds, and its own settings
    (the loader arguments it passes: the baseline's values)."""
    kt = for_request(replace(request, knobs={}), role="probe")
    script.run(request.script, list(request.args))
    kt.result_check()
    seen = kt.driver.description  # type: ignore[attr-defined]
    models = [m for m, _ in kt.models]
    dataset = seen.get("dataset")
    settings = dict(seen.get("settings") or {})
    sample = None
    if dataset is not None and _sized(dataset):
        try:
            sample = dataset[0]
        except Exception:  # an IterableDataset, or indexing that needs more than an int
            sample = None
    if request.nproc > 1 and "prepare" not in kt.used:
        raise WorkloadError(f"the script never calls kt.prepare(model): a data-parallel study "
                            f"(nproc = {request.nproc}) needs it to wrap the model in DistributedDataParallel with "
                            f"the trial's knobs")
    if request.nproc > 1 and kt.integration:
        raise WorkloadError(f"a data-parallel study (nproc = {request.nproc}) of a script trained by "
                            f"{kt.integration}'s own loop is not supported yet: tune it with nproc = 1, or train "
                            f"with kt.batches")
    return {
        **_group(request, kt.device, models),
        "name": Path(request.script).name,
        "parameters": sum(p.numel() for m in models for p in m.parameters() if p.requires_grad),
        "train_samples": _sized(dataset) if dataset is not None else None,
        "eval_samples": None,
        "sample_shape": _shape(sample) if sample is not None else None,
        "conv": any(has_conv(m) for m in models),
        "batch_size": settings.get("batch_size") or seen.get("loader_batch_size"),
        "settings": settings,
        "calls": sorted(kt.used),
        "integration": kt.integration,
        "variable_lengths": kt.variable_lengths,
        **optimizer_impls(kt.prepared[0] if kt.prepared else None, kt.device),
    }


def describe(request: Request) -> dict[str, Any]:
    if request.script:
        return describe_script(request)
    workload = load(request.workload, request.workload_options)
    model = workload.build_model()
    sample = workload.train_dataset[0] if _sized(workload.train_dataset) else None
    inputs = sample[0] if isinstance(sample, (list, tuple)) else sample
    return {
        **_group(request, _device(), [model]),
        "name": workload.name,
        "parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "train_samples": _sized(workload.train_dataset),
        "eval_samples": _sized(workload.eval_dataset),
        "sample_shape": _shape(inputs) if inputs is not None else None,
        "conv": has_conv(model),
        "batch_size": workload.batch_size,
        **optimizer_impls(workload.build_optimizer(model.parameters()), _device()),
    }


def _group(request: Request, device: torch.device, models: list[torch.nn.Module]) -> dict[str, Any]:
    """For a data-parallel study: the backend and the compression hooks it takes here (tried on
    a one-rank group), and whether the model has buffers (broadcast_buffers matters then)."""
    if request.nproc <= 1:
        return {}
    from knobtune.trainers.pytorch import distributed

    return {"distributed": {"nproc": request.nproc, **distributed.capabilities(device)},
            "buffers": sum(b.numel() for m in models for b in m.buffers())}


def _device() -> torch.device:
    """The device a trial trains on (initialises CUDA: the probe's child reports it anyway)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


run = probe_handler(env.fingerprint, describe)
