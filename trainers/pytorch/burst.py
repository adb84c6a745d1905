"""One PyTorch trial: apply every knob for real, run the measured burst, evaluate, guard."""
from __future__ import annotations

import random
import resource
import time
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from trainers.common.errors import InvalidKnobs
from trainers.common.protocol import BurstSpec, GuardReading, drive, make_schedule
from trainers.pytorch.workload import Workload, load

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune")


def _to_device(obj: Any, device: torch.device, non_blocking: bool) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_device(o, device, non_blocking) for o in obj)
    if isinstance(obj, dict):
        return {k: _to_device(v, device, non_blocking) for k, v in obj.items()}
    return obj


def _seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _check(knobs: dict[str, Any], device: torch.device) -> None:
    amp = knobs["amp"]
    if amp not in ("off", *AMP_DTYPES):
        raise InvalidKnobs(f"amp={amp!r}: expected 'off', 'bf16' or 'fp16'")
    if amp == "fp16" and device.type != "cuda":
        raise InvalidKnobs("amp='fp16' (with GradScaler) needs CUDA; this child has no CUDA device")
    if amp == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise InvalidKnobs("amp='bf16' is not supported by this GPU")
    if knobs["compile"] not in COMPILE_MODES:
        raise InvalidKnobs(f"compile={knobs['compile']!r}: expected one of {', '.join(COMPILE_MODES)}")


def build_loader(workload: Workload, knobs: dict[str, Any], seed: int) -> DataLoader:
    workers = int(knobs["num_workers"])
    extra: dict[str, Any] = {}
    if workers > 0:
        extra["prefetch_factor"] = int(knobs.get("prefetch_factor") or 2)
        extra["persistent_workers"] = bool(knobs.get("persistent_workers", False))
    loader = DataLoader(
        workload.train_dataset,
        batch_size=int(knobs["batch_size"]),
        shuffle=True,
        drop_last=True,  # every step sees the same shape: no recompiles, honest windows
        num_workers=workers,
        pin_memory=bool(knobs.get("pin_memory", False)),
        collate_fn=workload.collate_fn,
        generator=torch.Generator().manual_seed(seed),
        **extra,
    )
    if len(loader) == 0:
        raise InvalidKnobs(
            f"batch_size={knobs['batch_size']} is larger than the training set "
            f"({len(workload.train_dataset)} samples)"  # type: ignore[arg-type]
        )
    return loader


def loader_report(loader: DataLoader) -> dict[str, Any]:
    """The DataLoader's settings, read back from the object that was built."""
    return {
        "batch_size": loader.batch_size,
        "num_workers": loader.num_workers,
        "pin_memory": loader.pin_memory,
        "prefetch_factor": loader.prefetch_factor,
        "persistent_workers": loader.persistent_workers,
        "drop_last": loader.drop_last,
    }


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


@torch.no_grad()
def evaluate(workload: Workload, model: torch.nn.Module, device: torch.device) -> float:
    """Score the held-out split with the trained weights: eager, fp32, no augmentation."""
    model.eval()
    loader = DataLoader(workload.eval_dataset, batch_size=512, shuffle=False, collate_fn=workload.collate_fn)
    outputs, targets = [], []
    for inputs, target in loader:
        outputs.append(model(_to_device(inputs, device, False)).float().cpu())
        targets.append(target)
    return float(workload.metric(torch.cat(outputs), torch.cat(targets)))


def run(request: dict[str, Any]) -> dict[str, Any]:
    knobs = dict(request["knobs"])
    spec = BurstSpec.from_dict(request["burst"])
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    _check(knobs, device)
    schedule = make_schedule(spec, int(knobs["batch_size"]), int(knobs["accumulation_steps"]))
    _seed(spec.seed)
    threads = int(knobs.get("intra_op_threads", 0))
    if threads > 0:
        torch.set_num_threads(threads)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = bool(knobs.get("cudnn_benchmark", False))
        torch.backends.cudnn.deterministic = bool(knobs.get("cudnn_deterministic", False))
    setup_start = time.perf_counter()
    workload = load(request["workload"], request.get("workload_options"))

    model = workload.build_model().to(device)
    channels_last = bool(knobs.get("channels_last", False))
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = workload.build_optimizer(model.parameters())
    mode = knobs["compile"]
    step_model = model if mode == "off" else torch.compile(model, mode=None if mode == "default" else mode)
    loader = build_loader(workload, knobs, spec.seed)
    amp = knobs["amp"]
    autocast = (
        torch.autocast(device_type=device.type, dtype=AMP_DTYPES[amp]) if amp != "off" else nullcontext()
    )
    scaler = torch.amp.GradScaler(device.type, enabled=amp == "fp16")
    k = schedule.accumulation_steps
    non_blocking = loader.pin_memory and device.type == "cuda"
    mark_step = mode == "reduce-overhead" and device.type == "cuda"
    setup_seconds = time.perf_counter() - setup_start

    # Guard state lives on the device: updated every step, read only at window boundaries.
    bad = torch.zeros((), dtype=torch.bool, device=device)
    first_bad = torch.full((), -1, dtype=torch.long, device=device)
    counter = torch.zeros((), dtype=torch.long, device=device)
    loss_sum = torch.zeros((), dtype=torch.float32, device=device)
    loss_steps = 0
    skipped = torch.zeros((), dtype=torch.long, device=device)
    iterator = None  # made in the first step, so worker start-up is timed as warm-up

    def next_batch() -> Any:
        nonlocal iterator
        if iterator is None:
            iterator = iter(loader)
        try:
            return next(iterator)
        except StopIteration:  # next epoch (persistent_workers keeps the workers alive)
            iterator = iter(loader)
            return next(iterator)

    def step(i: int, count: int = 1) -> int:
        nonlocal loss_steps
        inputs, targets = next_batch()
        inputs = _to_device(inputs, device, non_blocking)
        targets = _to_device(targets, device, non_blocking)
        if channels_last and isinstance(inputs, torch.Tensor) and inputs.dim() == 4:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        if mark_step:
            torch.compiler.cudagraph_mark_step_begin()
        with autocast:
            loss = workload.loss_fn(step_model(inputs), targets)
        value = loss.detach().float()
        bad_now = ~torch.isfinite(value)
        bad.logical_or_(bad_now)
        first_bad.copy_(torch.where(bad_now & (first_bad < 0), counter, first_bad))
        counter.add_(1)
        loss_sum.add_(value)
        loss_steps += 1
        scaler.scale(loss / k if k > 1 else loss).backward()
        if (i + 1) % k == 0 or i + 1 == schedule.total_steps:
            if scaler.is_enabled():
                before = scaler._scale.clone()  # type: ignore[union-attr]
                scaler.step(optimizer)
                scaler.update()
                skipped.add_((scaler._scale < before).long())  # type: ignore[operator]
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return int(targets.shape[0]) if isinstance(targets, torch.Tensor) else len(targets)

    def checkpoint() -> GuardReading:
        nonlocal loss_steps
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        mean = loss_sum.item() / max(1, loss_steps)
        loss_sum.zero_()
        loss_steps = 0
        first = int(first_bad.item())
        return GuardReading(finite=not bool(bad.item()), first_bad_step=first if first >= 0 else None, mean_loss=mean)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    model.train()
    try:
        record = drive(schedule, step, checkpoint)
    except (torch.OutOfMemoryError, MemoryError) as exc:
        return {"outcome": "oom", "failure": f"out of memory: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"}
    finally:
        del iterator  # shuts DataLoader workers down before evaluation

    channels_last_used = channels_last and next(model.parameters()).is_contiguous(memory_format=torch.channels_last)
    result: dict[str, Any] = {
        **record.measurement(),
        # Every knob as the framework objects report it (read back, not echoed from the request).
        "knobs_effective": {
            "batch_size": loader.batch_size,
            "accumulation_steps": k,
            "num_workers": loader.num_workers,
            "prefetch_factor": loader.prefetch_factor,
            "persistent_workers": loader.persistent_workers,
            "pin_memory": loader.pin_memory,
            "intra_op_threads": threads and torch.get_num_threads(),
            "amp": {None: "off", torch.bfloat16: "bf16", torch.float16: "fp16"}[
                getattr(autocast, "fast_dtype", None) if amp != "off" else None
            ],
            "compile": mode if step_model is not model else "off",
            "channels_last": channels_last_used,
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "cudnn_deterministic": torch.backends.cudnn.deterministic,
        },
        "setup_seconds": setup_seconds,
        "effective_batch_size": schedule.batch_size * k,
        "amp_skipped_steps": int(skipped.item()),
        "loader": loader_report(loader),
        "applied": {
            "device": device.type,
            "autocast_dtype": str(AMP_DTYPES[amp]).replace("torch.", "") if amp != "off" else None,
            "grad_scaler": scaler.is_enabled(),
            "compile_mode": mode,
            "compiled": step_model is not model,
            "channels_last": channels_last_used,
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "cudnn_deterministic": torch.backends.cudnn.deterministic,
            "accumulation_steps": k,
            "torch_threads": torch.get_num_threads(),
        },
    }
    if record.nan_step is not None:
        result.update(
            outcome="nan",
            failure=f"loss became non-finite at step {record.nan_step} of {schedule.total_steps}",
        )
    else:
        eval_start = time.perf_counter()
        result["val_accuracy"] = evaluate(workload, model, device)
        result["eval_seconds"] = time.perf_counter() - eval_start
        result["outcome"] = "ok"
    result["peak_memory_mb"] = peak_memory_mb(device)
    return result
