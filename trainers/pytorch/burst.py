"""One PyTorch trial: apply every knob for real, run the measured burst, evaluate, guard."""
from __future__ import annotations

import inspect
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
from trainers.pytorch import compiled
from trainers.pytorch.data import SeededSampler
from trainers.pytorch.faults import oom_reason
from trainers.pytorch.workload import Workload, accuracy, load

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune")
MATMUL_PRECISIONS = ("highest", "high", "medium")
# Optimizers with a fused CUDA implementation that takes GradScaler's scale and found_inf on the
# device (``_step_supports_amp_scaling``): with them fp16 needs no host read per step.
FUSABLE = (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD)


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
    if amp == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
        raise InvalidKnobs("amp='bf16' is not supported by this GPU")
    mode = knobs["compile"]
    if mode not in COMPILE_MODES:
        raise InvalidKnobs(f"compile={mode!r}: expected one of {', '.join(COMPILE_MODES)}")
    if compiled.uses_cuda_graphs(mode, device) and int(knobs.get("accumulation_steps", 1)) > 1:
        # AccumulateGrad keeps the first backward's gradient, which lives in the CUDA-graph pool,
        # as .grad; the next replay overwrites it.
        raise InvalidKnobs(f"compile={mode!r} replays CUDA graphs, which overwrite gradients accumulated "
                           f"across micro-batches: accumulation_steps={knobs['accumulation_steps']} needs "
                           f"compile 'off' or 'default'")
    precision = knobs.get("matmul_precision", "highest")
    if precision not in MATMUL_PRECISIONS:
        raise InvalidKnobs(f"matmul_precision={precision!r}: expected one of {', '.join(MATMUL_PRECISIONS)}")


def read_ahead(knobs: dict[str, Any]) -> int:
    """Batches a DataLoader holds ready at most: every worker's prefetch_factor batches."""
    workers = int(knobs["num_workers"])
    return workers * int(knobs.get("prefetch_factor") or 2) if workers > 0 else 0


def build_loader(workload: Workload, knobs: dict[str, Any], seed: int) -> DataLoader:
    workers = int(knobs["num_workers"])
    extra: dict[str, Any] = {}
    if workers > 0:
        extra["prefetch_factor"] = int(knobs.get("prefetch_factor") or 2)
        extra["persistent_workers"] = bool(knobs.get("persistent_workers", False))
    size = len(workload.train_dataset)  # type: ignore[arg-type]
    loader = DataLoader(
        workload.train_dataset,
        batch_size=int(knobs["batch_size"]),
        sampler=SeededSampler(size, seed),  # order and augmentation independent of num_workers
        drop_last=True,  # every step sees the same shape: no recompiles, honest windows
        num_workers=workers,
        pin_memory=bool(knobs.get("pin_memory", False)),
        collate_fn=workload.collate_fn,
        # the workers' base seed comes from this generator; without it the loader draws it from
        # torch's global RNG, and dropout in the training process would get another stream with
        # workers than without
        generator=torch.Generator().manual_seed(seed),
        **extra,
    )
    if len(loader) == 0:
        raise InvalidKnobs(f"batch_size={knobs['batch_size']} is larger than the training set ({size} samples)")
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


def ready_batches(iterator: Any) -> int | None:
    """Batches a multi-process DataLoader iterator holds loaded and not yet handed out (its
    result queues and its reorder buffer); None when this torch does not let us count them."""
    try:
        queues = {id(q): q for q in (iterator._worker_result_queue, iterator._data_queue)}
        queued = sum(q.qsize() for q in queues.values())
        reordered = sum(1 for info in iterator._task_info.values() if len(info) == 2)
    except (AttributeError, NotImplementedError, OSError):
        return None
    return queued + reordered


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


@torch.no_grad()
def evaluate(workload: Workload, model: torch.nn.Module, device: torch.device, batch_size: int) -> float:
    """Score the held-out split with the trained weights: eager, fp32, no augmentation, in
    batches of ``batch_size``. The default metric (top-1) is counted on the device; a custom
    metric gets all outputs, gathered on the host."""
    model.eval()
    loader = DataLoader(workload.eval_dataset, batch_size=batch_size, shuffle=False, collate_fn=workload.collate_fn)
    streaming = workload.metric is accuracy
    correct = torch.zeros((), dtype=torch.long, device=device)
    seen = 0
    outputs, targets = [], []
    for inputs, target in loader:
        out = model(_to_device(inputs, device, False))
        if streaming:
            correct += (out.argmax(dim=1) == _to_device(target, device, False)).sum()
            seen += len(target)
        else:
            outputs.append(out.float().cpu())
            targets.append(target)
    if streaming:
        return int(correct.item()) / max(1, seen)
    return float(workload.metric(torch.cat(outputs), torch.cat(targets)))


def _fused(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer | None:
    """The same optimizer with ``fused=True``, or None when it has no fused CUDA implementation."""
    if type(optimizer) not in FUSABLE or optimizer.defaults.get("fused") or optimizer.defaults.get("differentiable"):
        return None
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if not params or not all(p.is_cuda and p.is_floating_point() for p in params):
        return None
    accepted = inspect.signature(type(optimizer).__init__).parameters
    # defaults can hold keys the constructor does not take (AdamW's decoupled_weight_decay)
    options = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    groups = [{**group, "fused": True, "foreach": None} for group in optimizer.param_groups]
    try:
        return type(optimizer)(groups, **{**options, "fused": True, "foreach": None})
    except (RuntimeError, ValueError, TypeError):
        return None


class Trainer:
    """Every knob applied to one workload: model, optimizer, compile, autocast, scaler, loader,
    and the device-side NaN guard. The burst, the time-to-accuracy evaluations and the diagnosis
    ceilings all train through ``train_on``.

    The guard costs one small device op per micro-batch and no sync: each step's loss is copied
    into a preallocated device buffer; at the segment boundary the segment's slice is summed once
    (a non-finite value survives the sum) and, only when it is not finite, searched for the first
    bad step. (Keeping the loss tensors in a Python list instead costs no device op, but measured
    1-2 % on a fast CPU step: hundreds of live tensor objects make the garbage collector's passes
    longer.)"""

    def __init__(self, request: dict[str, Any]) -> None:
        knobs = self.knobs = dict(request["knobs"])
        self.spec = BurstSpec.from_dict(request["burst"])
        device = self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        _check(knobs, device)
        self.schedule = make_schedule(self.spec, int(knobs["batch_size"]), int(knobs["accumulation_steps"]),
                                      read_ahead=read_ahead(knobs))
        _seed(self.spec.seed)
        self.threads = int(knobs.get("intra_op_threads", 0))
        if self.threads > 0:
            torch.set_num_threads(self.threads)
        if device.type == "cuda":
            torch.backends.cudnn.benchmark = bool(knobs.get("cudnn_benchmark", False))
            torch.backends.cudnn.deterministic = bool(knobs.get("cudnn_deterministic", False))
            torch.set_float32_matmul_precision(knobs.get("matmul_precision", "highest"))
        setup_start = time.perf_counter()
        self.workload = workload = load(request["workload"], request.get("workload_options"))
        self.mode = mode = knobs["compile"]
        self.replays = compiled.ReplayCounter() if compiled.uses_cuda_graphs(mode, device) else None
        model = workload.build_model().to(device)
        self.channels_last = bool(knobs.get("channels_last", False))
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.model = model
        self.amp = amp = knobs["amp"]
        optimizer = workload.build_optimizer(model.parameters())
        self.fused_for_scaler = False
        if amp == "fp16" and device.type == "cuda" and not getattr(optimizer, "_step_supports_amp_scaling", False):
            fused = _fused(optimizer)
            if fused is not None:
                optimizer, self.fused_for_scaler = fused, True
        self.optimizer = optimizer
        self.lr_scale = float(request.get("lr_scale", 1.0))
        if self.lr_scale != 1.0:  # lr_scaling: the workload's learning rate, rescaled with the effective batch
            for group in self.optimizer.param_groups:
                group["lr"] = group["lr"] * self.lr_scale
        self.step_model = model if mode == "off" else torch.compile(model, mode=None if mode == "default" else mode)
        self.loader = build_loader(workload, knobs, self.spec.seed)
        self.autocast = (
            torch.autocast(device_type=device.type, dtype=AMP_DTYPES[amp]) if amp != "off" else nullcontext()
        )
        self.scaler = torch.amp.GradScaler(device.type, enabled=amp == "fp16")
        self.non_blocking = self.loader.pin_memory and device.type == "cuda"
        self.mark_step = compiled.uses_cuda_graphs(mode, device)
        self.setup_seconds = time.perf_counter() - setup_start
        self.guarded = bool(request.get("guard", True))
        self.sync_debug = bool(request.get("sync_debug")) and device.type == "cuda"
        self.losses = torch.zeros(self.schedule.total_steps, dtype=torch.float32, device=device)
        self.steps_read = 0  # micro-batches before this segment
        self.steps_seen = 0  # micro-batches trained so far
        self.found_inf: list[torch.Tensor] = []  # fp16: GradScaler's per-step found_inf flags
        self.skipped = torch.zeros((), dtype=torch.float32, device=device)
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

    def drained(self) -> bool | None:
        """Whether the DataLoader's read-ahead is used up (at most one batch waiting); None when
        it cannot be counted. Single-process loading has no read-ahead."""
        if self.loader.num_workers == 0 or self.iterator is None:
            return True
        ready = ready_batches(self.iterator)
        return None if ready is None else ready <= 1

    def train_on(self, inputs: Any, targets: Any, i: int) -> int:
        """Micro-batch ``i``: forward, backward, and the optimizer step when due. No sync; the
        guard's one op is the loss copied into its buffer."""
        k = self.schedule.accumulation_steps
        if self.mark_step:
            torch.compiler.cudagraph_mark_step_begin()
        with self.autocast:
            loss = self.workload.loss_fn(self.step_model(inputs), targets)
        if self.guarded:
            self.losses[i].copy_(loss.detach())
            self.steps_seen = i + 1
        self.scaler.scale(loss / k if k > 1 else loss).backward()
        if (i + 1) % k == 0 or i + 1 == self.schedule.total_steps:
            if self.scaler.is_enabled():
                self.scaler.step(self.optimizer)
                self.found_inf.extend(self.scaler._found_inf_per_device(self.optimizer).values())
                self.scaler.update()
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
        """The segment boundary: synchronise, then read the segment's losses (one sum)."""
        if self.sync_debug:
            torch.cuda.set_sync_debug_mode("default")
        self.sync()
        first_bad, mean, finite = None, None, True
        if self.found_inf:
            self.skipped += torch.stack(self.found_inf).float().sum()
            self.found_inf = []
        start, end = self.steps_read, self.steps_seen
        if end > start:
            segment = self.losses[start:end]
            total = float(segment.sum().item())
            finite = bool(np.isfinite(total))
            mean = total / (end - start)
            if not finite:
                first_bad = start + int((~torch.isfinite(segment)).nonzero()[0, 0].item())
        self.steps_read = end
        if self.sync_debug:  # every segment after warm-up must run without a host-device sync
            torch.cuda.set_sync_debug_mode("error")
        return GuardReading(finite=finite, first_bad_step=first_bad, mean_loss=mean)

    def eval_batch_size(self) -> int:
        return int(self.workload.eval_batch_size or self.schedule.batch_size)

    def evaluate(self) -> float:
        if self.sync_debug:
            torch.cuda.set_sync_debug_mode("default")
        accuracy_ = evaluate(self.workload, self.model, self.device, self.eval_batch_size())
        self.model.train()
        if self.sync_debug:
            torch.cuda.set_sync_debug_mode("error")
        return accuracy_

    def worker_exit_codes(self) -> list[int]:
        """Exit codes of the DataLoader workers that have ended (negative: killed by that signal)."""
        workers = getattr(self.iterator, "_workers", None) or []
        return [w.exitcode for w in workers if w.exitcode is not None]

    def close(self) -> None:
        if self.sync_debug:
            torch.cuda.set_sync_debug_mode("default")
        self.iterator = None  # shuts DataLoader workers down

    def compile_report(self) -> dict[str, Any] | None:
        return compiled.report(self.mode, self.replays) if self.mode != "off" else None

    def channels_last_used(self) -> bool:
        """Read from the convolution weights (the tensors channels_last is for), not any parameter."""
        convs = [m.weight for m in self.model.modules()
                 if isinstance(m, (torch.nn.Conv2d, torch.nn.ConvTranspose2d)) and m.weight.dim() == 4]
        return bool(convs) and all(w.is_contiguous(memory_format=torch.channels_last) for w in convs)

    def per_step_sync(self) -> str | None:
        """Why this trial syncs the host with the device every step (None: it does not)."""
        if self.scaler.is_enabled() and not getattr(self.optimizer, "_step_supports_amp_scaling", False):
            return (f"fp16: GradScaler reads found_inf on the host every step ({type(self.optimizer).__name__} "
                    f"has no fused implementation that takes it on the device)")
        return None


def run(request: dict[str, Any]) -> dict[str, Any]:
    """The burst request's result: measurements, knobs read back, accuracy, or an oom outcome.
    Building the trainer (the model's move to the device), training and evaluation all run
    inside the out-of-memory handling."""
    t: Trainer | None = None
    try:
        t = Trainer(request)
        return _measure(t, request)
    except Exception as exc:
        reason = oom_reason(exc, t.worker_exit_codes() if t is not None else ())
        if reason is None:
            raise
        return {"outcome": "oom", "failure": reason}
    finally:
        if t is not None:
            t.close()


def _measure(t: Trainer, request: dict[str, Any]) -> dict[str, Any]:
    device, schedule, loader, model, step_model = t.device, t.schedule, t.loader, t.model, t.step_model
    k, mode, amp, scaler, autocast, threads = (
        schedule.accumulation_steps, t.mode, t.amp, t.scaler, t.autocast, t.threads)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    model.train()
    record = drive(schedule, t.step, t.checkpoint, hooks=hooks_from(request, t.evaluate), drained=t.drained)
    t.close()
    compile_report = t.compile_report()
    compile_used = compiled.effective_mode(mode, compile_report, device.type == "cuda")
    channels_last_used = t.channels_last_used()
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
            "compile": compile_used,
            "channels_last": channels_last_used,
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "cudnn_deterministic": torch.backends.cudnn.deterministic,
            "matmul_precision": torch.get_float32_matmul_precision(),
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
            "fused_optimizer_for_grad_scaler": t.fused_for_scaler,
            "per_step_sync": t.per_step_sync(),
            "compile_mode": mode,
            "compiled": step_model is not model,
            "compile_report": compile_report,
            "channels_last": channels_last_used,
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "cudnn_deterministic": torch.backends.cudnn.deterministic,
            "matmul_precision": torch.get_float32_matmul_precision(),
            # PyTorch's own default: cuDNN convolutions in TF32 (matmuls follow matmul_precision)
            "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32) if device.type == "cuda" else None,
            "accumulation_steps": k,
            "torch_threads": torch.get_num_threads(),
            "learning_rate": t.optimizer.param_groups[0]["lr"],
            "read_ahead_batches": read_ahead(t.knobs),
            "eval_batch_size": t.eval_batch_size(),
        },
    }
    if record.nan_step is not None:
        result.update(
            outcome="nan",
            failure=f"loss became non-finite at step {record.nan_step} of {schedule.total_steps}",
        )
    else:
        eval_start = time.perf_counter()
        result["val_accuracy"] = t.evaluate()
        result["eval_seconds"] = time.perf_counter() - eval_start
        result["outcome"] = "ok"
    result["peak_memory_mb"] = peak_memory_mb(device)
    return result
