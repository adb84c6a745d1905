"""The integration API for PyTorch: the few calls a training script makes so that knobtune can
tune it (inside a trial) and run the winner (in production) through the same lines::

    kt = Tuned.load()                                  # trial: its knobs; production: the export
    loader = kt.dataloader(train_set, shuffle=True, batch_size=64)
    model = kt.prepare(model)                          # device, channels_last, torch.compile
    for epoch in range(epochs):
        for x, y in kt.batches(loader):                # device copies, timing, the burst's end
            with kt.autocast():
                loss = loss_fn(model(x), y)
            kt.backward(loss, optimizer)               # GradScaler, accumulation, NaN guard
    kt.report(val_accuracy=evaluate(model))

Roles: inside a trial's child (``trial``, ``diagnose``) the knobs are the trial's and
``batches`` runs the measured burst (epoch after epoch until ``train_samples``, then nothing
more); in the probe it stops the script at the first batch; in production the knobs come from
an export (``$KNOBTUNE_CONFIG`` or a path) and a watchdog compares the live rate with the
confirmed one; with neither, the script's own arguments apply. The built-in workloads train
through this same API (trainers/pytorch/burst.py).
"""
from __future__ import annotations

import os
import random
import time
from typing import Any, Callable, ContextManager, Iterator, Mapping

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from knobtune.spaces.pytorch import SPACE, Trained, impl_used
from knobtune.trainers.common import production
from knobtune.trainers.common.errors import InvalidKnobs, WorkloadError
from knobtune.trainers.common.production import Watchdog, WatchdogSettings, log
from knobtune.trainers.common.protocol import GuardReading, Schedule, WindowTimer, drive, hooks_from, make_schedule
from knobtune.trainers.common.script import ScriptDone, batch_length
from knobtune.trainers.common.tuned import TRIAL_ROLES, Trial, TunedBase, export_knobs
from knobtune.trainers.common.wire import Request
from knobtune.trainers.pytorch import compiled
from knobtune.trainers.pytorch import knobs as K
from knobtune.trainers.pytorch.data import SeededSampler


_ACTIVE: "Tuned | None" = None  # the trial or probe this child process runs


def activate(kt: "Tuned | None") -> None:
    """Make ``kt`` what ``Tuned.load()`` returns in this process (a trial's or probe's child)."""
    global _ACTIVE
    _ACTIVE = kt


def _leading(leaf: Any) -> int | None:
    return int(leaf.shape[0]) if isinstance(leaf, torch.Tensor) and leaf.dim() > 0 else None


def count(batch: Any) -> int:
    """Samples in a batch: its first tensor's batch dimension (tuples, lists, dicts nested)."""
    return batch_length(batch, _leading)


def to_device(obj: Any, device: torch.device, non_blocking: bool) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
        return type(obj)(*(to_device(o, device, non_blocking) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(o, device, non_blocking) for o in obj)
    if isinstance(obj, Mapping):
        moved = {k: to_device(v, device, non_blocking) for k, v in obj.items()}
        try:
            return type(obj)(moved)
        except TypeError:  # a mapping that cannot be built from a dict
            return moved
    return obj


class LossGuard:
    """The device-side NaN/Inf guard: each micro-batch's loss is copied into a preallocated
    device buffer (one small op, no sync); at a segment boundary the segment's slice is summed
    once (a non-finite value survives the sum) and, only when it is not finite, searched for the
    first bad step. (A Python list of loss tensors costs no device op but measured 1-2 % slower
    on a fast CPU step: hundreds of live tensors lengthen the garbage collector's passes.)"""

    def __init__(self, steps: int, device: torch.device) -> None:
        self.losses = torch.zeros(max(1, steps), dtype=torch.float32, device=device)
        self.read_to = 0  # micro-batches before the current segment
        self.seen = 0     # micro-batches recorded so far

    def record(self, i: int, loss: torch.Tensor) -> None:
        self.losses[i % len(self.losses)].copy_(loss.detach())
        self.seen = i + 1

    def read(self) -> tuple[bool, int | None, float | None]:
        """(finite, first bad step, mean loss) of the segment since the last read; after a sync."""
        start, end = self.read_to, self.seen
        self.read_to = end
        if end <= start:
            return True, None, None
        segment = self.losses[start:end] if end <= len(self.losses) else self.losses
        total = float(segment.sum().item())
        if np.isfinite(total):
            return True, None, total / len(segment)
        bad = int((~torch.isfinite(segment)).nonzero()[0, 0].item())
        return False, start + bad if end <= len(self.losses) else None, None


class Tuned(TunedBase):
    """A script's handle on knobtune. Make it with ``Tuned.load()``."""

    EXERCISED_BY = {
        "dataloader": (K.LOADER_KNOBS, "the script's DataLoader is not built by kt.dataloader(...)"),
        "prepare": (("compile", "channels_last"), "the script never calls kt.prepare(model)"),
        "prepare_optimizer": (("optimizer_impl",), "the script never passes its optimizer to "
                                                   "kt.prepare(model, optimizer)"),
        "autocast": (("amp",), "the script never enters kt.autocast()"),
    }
    START_HINT = "does it iterate kt.batches(...)?"

    def __init__(self, knobs: dict[str, Any], *, role: str, explicit: set[str] | None = None,
                 trial: Trial | None = None, config: dict[str, Any] | None = None,
                 settings: WatchdogSettings | None = None, device: torch.device | None = None) -> None:
        self.role = role
        self.knobs = {**K.DEFAULTS, "batch_size": None, **knobs}
        self.explicit = set(knobs) if explicit is None else explicit
        self.trial, self.config = trial, config
        self.device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.created = time.perf_counter()
        # a trial sets every knob; production the export's; without a config the script's own
        # settings (cuDNN flags, matmul precision, threads it set itself) stay as they are
        wanted = set(self.knobs) if role in TRIAL_ROLES else self.explicit
        SPACE.apply(self.knobs, wanted, Trained(self.device, self.knobs), environ=True)  # before CUDA allocates
        if role in TRIAL_ROLES:
            K.check(self.knobs, self.device)
        SPACE.apply(self.knobs, wanted, Trained(self.device, self.knobs))
        self.accumulation = int(self.knobs["accumulation_steps"])
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.knobs["amp"] == "fp16")
        self._autocast = K.autocast(self.knobs, self.device)
        self.used: set[str] = set()
        # id(loader) -> its dataset, other arguments, shuffle, and the script's own loader settings
        self.made: dict[int, tuple[Any, dict[str, Any], bool, dict[str, Any]]] = {}
        self.models: list[tuple[torch.nn.Module, torch.nn.Module]] = []  # (model, module trained with)
        self.optimizers: list[torch.optim.Optimizer] = []
        self.prepared: list[torch.optim.Optimizer] = []  # the optimizers kt.prepare returned
        self.fused_for_scaler = False
        self.mark_step = False
        self.replays: compiled.ReplayCounter | None = None
        self.iterator: Any = None
        self.last_loader: DataLoader | None = None
        self.ended_workers: list[int] = []
        self.step_index = 0       # the micro-batch the next backward belongs to
        self.micro_batches = 0    # production: micro-batches so far, across passes
        self.total_steps: int | None = None
        self.guard: LossGuard | None = None
        self.found_inf: list[torch.Tensor] = []
        self.skipped = torch.zeros((), dtype=torch.float32, device=self.device)
        self.sync_debug = bool(trial and trial.request.sync_debug) and self.device.type == "cuda"
        self.guarded = not trial or trial.request.guard
        self.lr_scale = trial.request.lr_scale if trial else float((config or {}).get("lr_scale") or 1.0)
        expected = production.expected_rate(config) if config else None
        self.watchdog = Watchdog(expected, settings or WatchdogSettings(), self._watch,
                                 compilations=compiled.compilations)
        self.accuracy: float | None = None

    # ----------------------------------------------------------------- loading

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None, *, strict: bool = False,
             watchdog_interval: float | None = None, watchdog_margin: float = 0.2) -> "Tuned":
        """The trial's knobs inside a trial; else the export at ``path`` or ``$KNOBTUNE_CONFIG``
        (checked: its format and framework; a different machine is a warning naming the
        differences; a knob this machine cannot apply falls back to PyTorch's default with a
        warning, or raises ConfigError with ``strict=True``); else the script's own settings."""
        if _ACTIVE is not None:
            if _ACTIVE.trial is not None:
                _ACTIVE.trial.loaded = True
            return _ACTIVE
        production.ensure_logging()
        settings = WatchdogSettings.from_env(watchdog_interval, watchdog_margin)
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        from knobtune.trainers.pytorch import env

        loaded = export_knobs(path, "pytorch", version_key="torch", fingerprint=env.fingerprint,
                              defaults={**K.DEFAULTS, "batch_size": None},
                              problems=lambda knobs: K.problems(knobs, device), strict=strict)
        if loaded is None:
            return cls({}, role="default", settings=settings)
        _, config, knobs = loaded
        return cls(knobs, role="production", config=config, settings=settings, device=device)

    # ----------------------------------------------------------------- the calls a script makes

    def dataloader(self, dataset: Any, *, shuffle: bool = False, train: bool = True, **kwargs: Any) -> DataLoader:
        """The training DataLoader over ``dataset``, with the knobs' batch size, workers,
        prefetch, pinning and persistence; the script's own arguments apply where no knob is set
        (and are its baseline). In a trial the order and augmentation stream do not depend on
        the workers, and the last partial batch is dropped (every step the same shape).
        ``train=False``: a plain DataLoader with the script's arguments (an evaluation loader:
        the same batches whatever the trial)."""
        if not train:
            return DataLoader(dataset, shuffle=shuffle, **kwargs)
        self.used.add("dataloader")
        names = {K.LOADER_ARGUMENTS.get(k, k): k for k in K.LOADER_KNOBS}  # DataLoader argument -> knob
        arguments = {k: v for k, v in kwargs.items() if k not in names}
        own = {names[k]: v for k, v in kwargs.items() if k in names}
        settings = {**own, **{k: v for k, v in self.knobs.items() if k in self.explicit}}
        loader = self._build(dataset, arguments, settings, shuffle)
        self.made[id(loader)] = (dataset, arguments, shuffle, own)
        self.last_loader = loader
        return loader

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> Any:
        """Move ``model`` to the device, apply channels_last and torch.compile; return the module
        to train with (``model`` is kept for evaluation: it shares the parameters). With
        ``optimizer``, return ``(module, optimizer)``: the optimizer rebuilt with the
        ``optimizer_impl`` knob's foreach or fused implementation (same class, param groups,
        options and state); with the default implementation under fp16 on CUDA, its fused twin,
        which takes GradScaler's state on the device (no sync per step)."""
        self.used.add("prepare")
        trained = K.prepare_model(model, self.knobs, self.device)
        self.models.append((model, trained))
        if compiled.uses_cuda_graphs(self.knobs["compile"], self.device):
            self.mark_step = True
            if self.replays is None and self.role in TRIAL_ROLES:
                self.replays = compiled.ReplayCounter()
        if optimizer is None:
            return trained
        self.used.add("prepare_optimizer")
        optimizer = self._optimizer(optimizer)
        self.prepared.append(optimizer)
        return trained, optimizer

    def _optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """``optimizer`` with the knobs' implementation (or, by default under fp16 on CUDA, fused
        for GradScaler); itself when a learning-rate scheduler already holds it."""
        impl = self.knobs["optimizer_impl"]
        wanted = impl != "default" and impl_used(optimizer) != impl
        scheduled = getattr(optimizer.step, "_wrapped_by_lr_sched", False)  # a scheduler holds this object
        if scheduled and (wanted or self.scaler.is_enabled()):
            log.warning(f"kt.prepare(model, optimizer): a learning-rate scheduler already drives this optimizer, so "
                        f"it is not rebuilt (optimizer_impl={impl!r}, fp16's fused twin): call kt.prepare before "
                        f"creating the scheduler")
            return optimizer
        if wanted:
            problem = K.impl_problem(optimizer, impl, self.device)
            if problem is None:
                return K.with_impl(optimizer, impl)
            if self.role in TRIAL_ROLES:
                raise InvalidKnobs(problem)
            log.warning(f"{problem}; running with its default implementation instead")
            return optimizer
        if impl == "default" and self.scaler.is_enabled() and not getattr(optimizer, "_step_supports_amp_scaling",
                                                                           False):
            twin = K.fused(optimizer)
            if twin is not None:
                self.fused_for_scaler = True
                return twin
        return optimizer

    def autocast(self) -> ContextManager[Any]:
        """The forward pass's mixed-precision context (a no-op with amp off)."""
        self.used.add("autocast")
        return self._autocast

    def batches(self, loader: Any, evaluate: Callable[[], float] | None = None) -> Iterator[Any]:
        """The loader's batches on the device. In a trial: the measured burst (warm-up, settle,
        windows), epoch after epoch until ``train_samples``; every later call yields nothing.
        ``evaluate()`` (optional) scores the model: time-to-accuracy studies call it between
        windows. In production: one pass, watched."""
        self.used.add("batches")
        if self.role == "probe":
            return self._probe(loader)
        if self.role in TRIAL_ROLES:
            return self._burst(loader, evaluate)
        return self._watched(loader)

    def backward(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        """Backward (loss-scaled under fp16, divided by accumulation_steps), the NaN guard's one
        device op, and the optimizer step and zero_grad once per accumulation_steps micro-batches."""
        self.used.add("backward")
        if not any(o is optimizer for o in self.optimizers):
            self.optimizers.append(optimizer)
            if self.lr_scale != 1.0:  # the learning rate the winner was measured with (lr_scaling)
                for group in optimizer.param_groups:
                    group["lr"] = group["lr"] * self.lr_scale
                    if "initial_lr" in group:  # a scheduler's base: LambdaLR and the like restart from it
                        group["initial_lr"] = group["initial_lr"] * self.lr_scale
                if getattr(optimizer.step, "_wrapped_by_lr_sched", False):
                    log.warning(f"lr_scale {self.lr_scale:.4g}: a learning-rate scheduler created before the "
                                f"first kt.backward keeps its own base learning rates; create it after, or scale "
                                f"them yourself")
        i, k = self.step_index, self.accumulation
        if self.guarded and self.guard is not None:
            self.guard.record(i, loss)
        self.scaler.scale(loss / k if k > 1 else loss).backward()
        if (i + 1) % k == 0 or (self.total_steps is not None and i + 1 == self.total_steps):
            if self.scaler.is_enabled():
                self.scaler.step(optimizer)
                found = self.scaler._found_inf_per_device(optimizer).values()
                if self.role in TRIAL_ROLES:  # read at the segment boundary
                    self.found_inf.extend(found)
                else:  # a long job: a running sum, not a list that grows every step
                    for flag in found:
                        self.skipped += flag
                self.scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    def stats(self) -> dict[str, Any]:
        """Live figures: in production the watchdog's (last interval's and mean samples/s against
        the confirmed rate); in a trial the burst's measurement so far."""
        if self.trial is not None and self.trial.timer is not None:
            return self.trial.timer.record.measurement()
        return {**self.watchdog.stats(), "knobs": self.knobs_effective()}

    # ----------------------------------------------------------------- internals

    def _build(self, dataset: Any, arguments: dict[str, Any], settings: dict[str, Any], shuffle: bool) -> DataLoader:
        loader_args = {**arguments, **K.loader_arguments(settings)}
        if "batch_size" not in settings:
            loader_args.pop("batch_size", None)
        iterable = isinstance(dataset, IterableDataset)
        if self.role in TRIAL_ROLES and self.trial is not None:
            seed = self.trial.request.seed
            if shuffle and not iterable and "sampler" not in arguments and "batch_sampler" not in arguments:
                # order and augmentation independent of num_workers
                loader_args["sampler"] = SeededSampler(len(dataset), seed)
            elif shuffle and not iterable:
                loader_args["shuffle"] = True
            # the workers' base seed comes from this generator; without it the loader draws it
            # from torch's global RNG, and dropout in the training process would get another
            # stream with workers than without
            loader_args.setdefault("generator", torch.Generator().manual_seed(seed))
            if "batch_sampler" not in arguments:
                loader_args["drop_last"] = True  # every step the same shape: no recompiles, honest windows
        elif shuffle and not iterable:
            loader_args["shuffle"] = True
        try:
            loader = DataLoader(dataset, **loader_args)
        except (TypeError, ValueError) as exc:
            raise WorkloadError(f"kt.dataloader(...): {exc}") from None
        if self.role in TRIAL_ROLES and not iterable and len(loader) == 0:
            raise InvalidKnobs(f"batch_size={loader.batch_size} is larger than the training set "
                               f"({len(dataset)} samples)")
        return loader

    def _rebuilt(self, loader: DataLoader, overrides: dict[str, Any]) -> DataLoader:
        """``loader`` again with other loader knobs (the diagnosis's input variants)."""
        dataset, arguments, shuffle, _ = self.made[id(loader)]
        settings = {**{k: v for k, v in self.knobs.items() if k in self.explicit}, **overrides}
        return self._build(dataset, arguments, settings, shuffle)

    def _on_device(self, batch: Any, loader: Any) -> Any:
        non_blocking = bool(getattr(loader, "pin_memory", False)) and self.device.type == "cuda"
        batch = to_device(batch, self.device, non_blocking)
        if self.knobs["channels_last"] and "prepare" in self.used:
            batch = _channels_last(batch)
        return batch

    def _endless(self, loader: Any, steps: int) -> Iterator[Any]:
        """``steps`` batches from ``loader``, epoch after epoch."""
        done, fresh = 0, False
        while done < steps:
            if self.iterator is None:
                self.iterator, fresh = iter(loader), True
            try:
                batch = next(self.iterator)
            except StopIteration:
                self.iterator = None
                if fresh:
                    raise WorkloadError("the training DataLoader gave no batch at all") from None
                continue
            fresh = False
            done += 1
            yield self._on_device(batch, loader)

    def _schedule(self, loader: Any, read_ahead: bool = True) -> Schedule:
        batch_size = getattr(loader, "batch_size", None)
        if not batch_size:
            raise WorkloadError("kt.batches(loader): the loader has no batch_size (a batch_sampler's batches have "
                                "no fixed size to tune); build it with kt.dataloader(dataset, ...)")
        ahead = K.read_ahead({"num_workers": getattr(loader, "num_workers", 0),
                              "prefetch_factor": getattr(loader, "prefetch_factor", None)}) if read_ahead else 0
        assert self.trial is not None
        return make_schedule(self.trial.request.burst, int(batch_size), self.accumulation, read_ahead=ahead)

    def _burst(self, loader: Any, evaluate: Callable[[], float] | None) -> Iterator[Any]:
        trial = self.trial
        assert trial is not None
        if trial.started:
            return  # the burst ran in the first pass; the script's other epochs are not trained
        trial.started = True
        trial.setup_seconds = time.perf_counter() - self.created
        trial.data = loader
        schedule = trial.schedule = self._schedule(loader)
        self.total_steps = schedule.total_steps
        self.guard = LossGuard(schedule.total_steps, self.device)
        if self.role == "diagnose":
            yield from self._diagnose(loader, schedule)
            return
        target = trial.request.target_accuracy
        if target is not None and evaluate is None:
            raise InvalidKnobs("time-to-accuracy needs an evaluation between windows: iterate "
                               "kt.batches(loader, evaluate=fn), fn() returning the held-out accuracy")
        hooks = hooks_from(trial.request, self._evaluator(evaluate) if evaluate else (lambda: 0.0))
        timer = trial.timer = WindowTimer(schedule, hooks=hooks, drained=self._drained)
        trial.record = timer.record
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        for model, _ in self.models:
            model.train()
        done = 0
        timer.start()
        try:
            for i, batch in enumerate(self._endless(loader, schedule.total_steps)):
                self.step_index = i
                if self.mark_step:
                    torch.compiler.cudagraph_mark_step_begin()
                yield batch
                done = i + 1
                if "backward" not in self.used:
                    raise WorkloadError("the training loop never calls kt.backward(loss, optimizer): knobtune "
                                        "needs it for the step, accumulation and the NaN guard")
                if not timer.passed(i + 1, count(batch), self._checkpoint):
                    break
            else:
                trial.completed = True
            trial.completed = trial.completed or timer.record.nan_step is not None or bool(timer.record.target_reached)
        finally:
            if not trial.completed:
                trial.stopped_at = done
            self._end_burst()

    def _end_burst(self) -> None:
        assert self.trial is not None
        self.trial.burst_end = time.perf_counter()
        if self.sync_debug:
            torch.cuda.set_sync_debug_mode("default")
        self.ended_workers = self.worker_exit_codes()  # an OOM kill is classified from these
        self.iterator = None  # shuts the DataLoader's workers down

    def _evaluator(self, evaluate: Callable[[], float]) -> Callable[[], float]:
        def score() -> float:
            if self.sync_debug:
                torch.cuda.set_sync_debug_mode("default")
            modes = [(m, m.training) for m, _ in self.models]
            value = float(evaluate())
            for model, training in modes:
                model.train(training)
            if self.sync_debug:
                torch.cuda.set_sync_debug_mode("error")
            return value

        return score

    def _drained(self) -> bool | None:
        """Whether the DataLoader's read-ahead is used up (at most one batch waiting); None when
        it cannot be counted. Single-process loading has no read-ahead."""
        if self.iterator is None or getattr(self.iterator, "_num_workers", 0) == 0:
            return True
        ready = K.ready_batches(self.iterator)
        return None if ready is None else ready <= 1

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _checkpoint(self) -> GuardReading:
        """A segment boundary: synchronise, then read the segment's losses (one sum)."""
        if self.sync_debug:
            torch.cuda.set_sync_debug_mode("default")
        self.sync()
        if self.found_inf:
            self.skipped += torch.stack(self.found_inf).float().sum()
            self.found_inf = []
        finite, first_bad, mean = self.guard.read() if self.guard is not None else (True, None, None)
        if self.sync_debug:  # every segment after warm-up must run without a host-device sync
            torch.cuda.set_sync_debug_mode("error")
        return GuardReading(finite=finite, first_bad_step=first_bad, mean_loss=mean)

    def _watch(self) -> None:
        """The watchdog's interval boundary: one sync, and the guard's sum read."""
        self.sync()
        if self.guard is not None:
            finite, _, _ = self.guard.read()
            if not finite:
                log.warning("the loss became non-finite during the last watchdog interval")

    def _watched(self, loader: Any) -> Iterator[Any]:
        if self.guard is None:
            self.guard = LossGuard(1024, self.device)  # a ring: read at each watchdog interval
        self.watchdog.resume()
        try:
            for batch in loader:
                batch = self._on_device(batch, loader)
                self.step_index = self.micro_batches
                self.micro_batches += 1
                if self.mark_step:
                    torch.compiler.cudagraph_mark_step_begin()
                yield batch
                self.watchdog.step(count(batch))
        finally:
            self.watchdog.pause()

    def _probe(self, loader: Any) -> Iterator[Any]:
        """The probe: describe the script's job from what it set up, then stop it."""
        assert self.trial is not None
        self.trial.started = True
        description = self.trial.description
        description["loader_batch_size"] = getattr(loader, "batch_size", None)
        # the loader the burst would train on: its dataset, and the settings the script gave it
        made = self.made.get(id(loader))
        description["dataset"] = made[0] if made else getattr(loader, "dataset", None)
        description["settings"] = made[3] if made else {}
        description["models"] = [model for model, _ in self.models]
        raise ScriptDone
        yield  # pragma: no cover - makes this a generator

    def _diagnose(self, loader: DataLoader, schedule: Schedule) -> Iterator[Any]:
        """The bottleneck diagnosis: the input ceiling (the loader alone, per variant) and the
        compute ceiling (the script's step on one batch already on the device)."""
        trial = self.trial
        assert trial is not None
        variants = trial.request.input_variants or {"as configured": {}}
        inputs = {}
        threads_before = torch.get_num_threads()
        for label, overrides in variants.items():
            threads = overrides.get("intra_op_threads")
            if threads:
                torch.set_num_threads(int(threads))
            variant = self._rebuilt(loader, overrides) if id(loader) in self.made and overrides else loader
            inputs[label] = self._input_ceiling(variant)
            torch.set_num_threads(threads_before)  # the compute ceiling runs with the trial's threads
        batch = next(self._endless(loader, 1))
        self.iterator = None
        plain = self._schedule(loader, read_ahead=False)
        self.total_steps = plain.total_steps
        self.guard = LossGuard(plain.total_steps, self.device)
        timer = WindowTimer(plain)
        timer.start()
        for i in range(plain.total_steps):
            self.step_index = i
            if self.mark_step:
                torch.compiler.cudagraph_mark_step_begin()
            yield batch
            timer.passed(i + 1, count(batch), self._checkpoint)
        trial.completed = True
        trial.diagnosis = {
            "outcome": "ok",
            "input_samples_per_second": max(inputs.values()),
            "input_variants": inputs,
            "compute_samples_per_second": float(timer.record.measurement()["samples_per_second"]),
        }

    def _input_ceiling(self, loader: Any) -> float:
        schedule = self._schedule(loader)
        batches = self._endless(loader, schedule.total_steps)

        def reading() -> GuardReading:
            self.sync()
            return GuardReading(True, None, None)

        record = drive(schedule, lambda i, n=1: count(next(batches)), reading, drained=self._drained)
        self.iterator = None
        return float(record.measurement()["samples_per_second"])

    # ----------------------------------------------------------------- the trial's result

    def close(self) -> None:
        """Shut the DataLoader's workers down and leave sync-debug mode."""
        if self.sync_debug:
            torch.cuda.set_sync_debug_mode("default")
        self.iterator = None

    def worker_exit_codes(self) -> list[int]:
        """Exit codes of the DataLoader workers that have ended (negative: killed by that signal)."""
        workers = getattr(self.iterator, "_workers", None) or []
        return [w.exitcode for w in workers if w.exitcode is not None] or list(self.ended_workers)

    def not_exercised(self) -> dict[str, str]:
        """Knob -> why it was not applied: the script never made the call that applies it (or
        trained on a DataLoader it built itself)."""
        out = self.uncalled()
        trial = self.trial
        if trial is not None and trial.data is not None and id(trial.data) not in self.made:
            why = self.EXERCISED_BY["dataloader"]
            out.update({name: why[1] for name in why[0]})
        return out

    def knobs_effective(self) -> dict[str, Any]:
        """Every knob as the framework objects report it (read back, not echoed from the request)."""
        loader = self.trial.data if self.trial and self.trial.data is not None else self.last_loader
        optimizer = self.optimizers[0] if self.optimizers else (self.prepared[-1] if self.prepared else None)
        trained = Trained(self.device, self.knobs, loader=loader if isinstance(loader, DataLoader) else None,
                          models=tuple(m for m, _ in self.models), optimizer=optimizer, autocast=self._autocast,
                          compile_report=self.compile_report(), accumulation=self.accumulation)
        return SPACE.read_back(trained, self.not_exercised())

    def compile_report(self) -> dict[str, Any] | None:
        return compiled.report(self.knobs["compile"], self.replays) if self.knobs["compile"] != "off" else None

    def result(self) -> dict[str, Any]:
        """The trial's result (what the child writes): measurements, knobs read back, accuracy,
        the outcome; or the probe's description, or the diagnosis."""
        trial = self.result_check()
        if trial.diagnosis is not None:
            return trial.diagnosis
        timer, schedule = trial.timer, trial.schedule
        assert timer is not None and schedule is not None
        record = timer.record
        loader = trial.data
        optimizer = self.optimizers[0] if self.optimizers else None
        compile_report = self.compile_report()
        result: dict[str, Any] = {
            **record.measurement(),
            "knobs_effective": self.knobs_effective(),
            "not_exercised": self.not_exercised(),
            "setup_seconds": trial.setup_seconds,
            "effective_batch_size": schedule.batch_size * self.accumulation,
            "lr_scale": self.lr_scale,
            "amp_skipped_steps": int(self.skipped.item()),
            "applied": {
                "device": self.device.type,
                "autocast_dtype": str(K.AMP_DTYPES[self.knobs["amp"]]).replace("torch.", "")
                if self.knobs["amp"] != "off" and "autocast" in self.used else None,
                "grad_scaler": self.scaler.is_enabled(),
                "fused_optimizer_for_grad_scaler": self.fused_for_scaler,
                "optimizer": type(optimizer).__name__ if optimizer is not None else None,
                "optimizer_impl": impl_used(optimizer) if optimizer is not None else None,
                "per_step_sync": K.per_step_sync(self.scaler, optimizer),
                "compile_mode": self.knobs["compile"],
                "compiled": any(m is not t for m, t in self.models),
                "compile_report": compile_report,
                "channels_last": self.knobs_effective().get("channels_last", False),
                "cudnn_benchmark": torch.backends.cudnn.benchmark,
                "cudnn_deterministic": torch.backends.cudnn.deterministic,
                "matmul_precision": torch.get_float32_matmul_precision(),
                # PyTorch's own default: cuDNN convolutions in TF32 (matmuls follow matmul_precision)
                "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32) if self.device.type == "cuda" else None,
                "accumulation_steps": self.accumulation,
                "torch_threads": torch.get_num_threads(),
                "learning_rate": optimizer.param_groups[0]["lr"] if optimizer is not None else None,
                "read_ahead_batches": K.read_ahead({"num_workers": getattr(loader, "num_workers", 0),
                                                    "prefetch_factor": getattr(loader, "prefetch_factor", None)}),
                "eval_batch_size": trial.metrics.get("eval_batch_size"),
            },
        }
        if loader is not None and isinstance(loader, DataLoader):
            result["loader"] = K.loader_report(loader)
        self.judge(result, "the script stopped iterating kt.batches(...) after {done} of the burst's {total} "
                           "micro-batches (the burst continues across epochs by itself)")
        result["peak_memory_mb"] = K.peak_memory_mb(self.device)
        result["memory_limit_mb"] = K.memory_limit_mb(self.device)
        return result


def _channels_last(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.contiguous(memory_format=torch.channels_last) if batch.dim() == 4 else batch
    if isinstance(batch, (list, tuple)) and batch and not hasattr(batch, "_fields"):
        # only the inputs (the first element) are images; targets stay as they are
        return type(batch)([_channels_last(batch[0]), *batch[1:]])
    return batch


def for_request(request: Request, role: str = "trial") -> Tuned:
    """The trial (or probe) a child runs: its knobs, and activated for ``Tuned.load()``."""
    trial = Trial(request)
    seed = trial.request.seed  # the model's initial weights and dropout: the same for every trial
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    kt = Tuned(dict(request.knobs), role=role, trial=trial)
    activate(kt)
    return kt
