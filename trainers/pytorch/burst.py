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
from trainers.common.protocol import BurstSpec, GuardReading, drive, hooks_from, make_schedule
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


class Trainer:
    """Every knob applied to one workload: model, optimizer, compile, autocast, scaler, loader,
    and the device-side NaN guard. The burst, the time-to-accuracy evaluations and the diagnosis
    ceilings all train through ``train_on``."""

    def __init__(self, request: dict[str, Any]) -> None:
        knobs = self.knobs = dict(request["knobs"])
        self.spec = BurstSpec.from_dict(request["burst"])
        device = self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        _check(knobs, device)
        self.schedule = make_schedule(self.spec, int(knobs["batch_size"]), int(knobs["accumulation_steps"]))
        _seed(self.spec.seed)
        self.threads = int(knobs.get("intra_op_threads", 0))
        if self.threads > 0:
            torch.set_num_threads(self.threads)
        if device.type == "cuda":
            torch.backends.cudnn.benchmark = bool(knobs.get("cudnn_benchmark", False))
            torch.backends.cudnn.deterministic = bool(knobs.get("cudnn_deterministic", False))
        setup_start = time.perf_counter()
        self.workload = workload = load(request["workload"], request.get("workload_options"))
        model = workload.build_model().to(device)
        self.channels_last = bool(knobs.get("channels_last", False))
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.model = model
        self.optimizer = workload.build_optimizer(model.parameters())
        self.lr_scale = float(request.get("lr_scale", 1.0))
        if self.lr_scale != 1.0:  # lr_scaling: the workload's learning rate, rescaled with the effective batch
            for group in self.optimizer.param_groups:
                group["lr"] = group["lr"] * self.lr_scale
        self.mode = mode = knobs["compile"]
        self.step_model = model if mode == "off" else torch.compile(model, mode=None if mode == "default" else mode)
        self.loader = build_loader(workload, knobs, self.spec.seed)
        self.amp = amp = knobs["amp"]
        self.autocast = (
            torch.autocast(device_type=device.type, dtype=AMP_DTYPES[amp]) if amp != "off" else nullcontext()
        )
        self.scaler = torch.amp.GradScaler(device.type, enabled=amp == "fp16")
        self.non_blocking = self.loader.pin_memory and device.type == "cuda"
        self.mark_step = mode == "reduce-overhead" and device.type == "cuda"
        self.setup_seconds = time.perf_counter() - setup_start
        # Guard state lives on the device: updated every step, read only at window boundaries.
        self.bad = torch.zeros((), dtype=torch.bool, device=device)
        self.first_bad = torch.full((), -1, dtype=torch.long, device=device)
        self.counter = torch.zeros((), dtype=torch.long, device=device)
        self.loss_sum = torch.zeros((), dtype=torch.float32, device=device)
        self.loss_steps = 0
        self.skipped = torch.zeros((), dtype=torch.long, device=device)
        self.iterator: Any = None  # made on first use, so worker start-up is timed as warm-up

    def next_batch(self) -> tuple[Any, Any]:
        """The next (inputs, targets) on the device, epoch after epoch."""
        if self.iterator is None:
            self.iterator = iter(self.loader)
        try:
            inputs, targets = next(self.iterator)
        except StopIteration:  # next epoch (persistent_workers keeps the workers alive)
            self.iterator = iter(self.loader)
            inputs, targets = next(self.iterator)
        inputs = _to_device(inputs, self.device, self.non_blocking)
        targets = _to_device(targets, self.device, self.non_blocking)
        if self.channels_last and isinstance(inputs, torch.Tensor) and inputs.dim() == 4:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        return inputs, targets

    def train_on(self, inputs: Any, targets: Any, i: int) -> int:
        """Micro-batch ``i``: forward, guard, backward, and the optimizer step when due. No sync."""
        k = self.schedule.accumulation_steps
        if self.mark_step:
            torch.compiler.cudagraph_mark_step_begin()
        with self.autocast:
            loss = self.workload.loss_fn(self.step_model(inputs), targets)
        value = loss.detach().float()
        bad_now = ~torch.isfinite(value)
        self.bad.logical_or_(bad_now)
        self.first_bad.copy_(torch.where(bad_now & (self.first_bad < 0), self.counter, self.first_bad))
        self.counter.add_(1)
        self.loss_sum.add_(value)
        self.loss_steps += 1
        self.scaler.scale(loss / k if k > 1 else loss).backward()
        if (i + 1) % k == 0 or i + 1 == self.schedule.total_steps:
            if self.scaler.is_enabled():
                before = self.scaler._scale.clone()  # type: ignore[union-attr]
                self.scaler.step(self.optimizer)
                self.scaler.update()
                self.skipped.add_((self.scaler._scale < before).long())  # type: ignore[operator]
            else:
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return int(targets.shape[0]) if isinstance(targets, torch.Tensor) else len(targets)

    def step(self, i: int, count: int = 1) -> int:  # count is 1: PyTorch runs one step per call
        inputs, targets = self.next_batch()
        return self.train_on(inputs, targets, i)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def checkpoint(self) -> GuardReading:
        self.sync()
        mean = self.loss_sum.item() / max(1, self.loss_steps)
        self.loss_sum.zero_()
        self.loss_steps = 0
        first = int(self.first_bad.item())
        return GuardReading(finite=not bool(self.bad.item()), first_bad_step=first if first >= 0 else None,
                            mean_loss=mean)

    def evaluate(self) -> float:
        accuracy = evaluate(self.workload, self.model, self.device)
        self.model.train()
        return accuracy

    def close(self) -> None:
        self.iterator = None  # shuts DataLoader workers down


def run(request: dict[str, Any]) -> dict[str, Any]:
    t = Trainer(request)
    device, schedule, loader, model, step_model = t.device, t.schedule, t.loader, t.model, t.step_model
    k, mode, amp, scaler, autocast, channels_last, threads = (
        schedule.accumulation_steps, t.mode, t.amp, t.scaler, t.autocast, t.channels_last, t.threads)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    model.train()
    try:
        record = drive(schedule, t.step, t.checkpoint, hooks=hooks_from(request, t.evaluate))
    except (torch.OutOfMemoryError, MemoryError) as exc:
        return {"outcome": "oom", "failure": f"out of memory: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"}
    finally:
        t.close()

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
        "setup_seconds": t.setup_seconds,
        "effective_batch_size": schedule.batch_size * k,
        "lr_scale": t.lr_scale,
        "amp_skipped_steps": int(t.skipped.item()),
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
            "learning_rate": t.optimizer.param_groups[0]["lr"],
        },
    }
    if record.nan_step is not None:
        result.update(
            outcome="nan",
            failure=f"loss became non-finite at step {record.nan_step} of {schedule.total_steps}",
        )
    else:
        eval_start = time.perf_counter()
        result["val_accuracy"] = evaluate(t.workload, model, device)
        result["eval_seconds"] = time.perf_counter() - eval_start
        result["outcome"] = "ok"
    result["peak_memory_mb"] = peak_memory_mb(device)
    return result
