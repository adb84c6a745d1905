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
confirmed one; with neither, the script's own arguments apply. Each role is a driver
(trainers/pytorch/roles.py), chosen once when the ``Tuned`` is made. The built-in workloads
train through this same API (trainers/pytorch/burst.py).
"""
from __future__ import annotations

import os
import random
import time
from typing import Any, Callable, ContextManager, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader

from knobtune.trainers.common.production import WatchdogSettings, ensure_logging, log
from knobtune.trainers.common.tuned import Trial, TunedBase, export_knobs
from knobtune.trainers.common.wire import Request
from knobtune.trainers.pytorch import compiled, distributed
from knobtune.trainers.pytorch import knobs as K
from knobtune.trainers.pytorch.loops import LoaderView, LossGuard, channels_last, to_device
from knobtune.trainers.pytorch.roles import DRIVERS, Driver

_ACTIVE: "Tuned | None" = None  # the trial or probe this child process runs


def activate(kt: "Tuned | None") -> None:
    """Make ``kt`` what ``Tuned.load()`` returns in this process (a trial's or probe's child)."""
    global _ACTIVE
    _ACTIVE = kt


class Tuned(TunedBase):
    """A script's handle on knobtune. Make it with ``Tuned.load()``."""

    EXERCISED_BY = {
        "dataloader": (K.LOADER_KNOBS, "the script's DataLoader is not built by kt.dataloader(...)"),
        "prepare": (("compile", "channels_last", *K.DDP_KNOBS), "the script never calls kt.prepare(model)"),
        "prepare_optimizer": (("optimizer_impl",), "the script never passes its optimizer to "
                                                   "kt.prepare(model, optimizer)"),
        "autocast": (("amp",), "the script never enters kt.autocast()"),
        "training_arguments": (("group_by_length",), "the script builds no Hugging Face TrainingArguments with "
                                                     "kt.training_arguments(...)"),
    }
    START_HINT = "does it iterate kt.batches(...)?"
    DRIVERS = DRIVERS
    driver: Driver

    def __init__(self, knobs: dict[str, Any], *, role: str, explicit: set[str] | None = None,
                 trial: Trial | None = None, config: dict[str, Any] | None = None,
                 settings: WatchdogSettings | None = None, device: torch.device | None = None) -> None:
        self.knobs = {**K.DEFAULTS, "batch_size": None, **knobs}
        self.explicit = set(knobs) if explicit is None else explicit
        self.config = config
        self.device = device or distributed.device()
        self.created = time.perf_counter()
        self._choose(role, trial, config, settings)
        wanted = self.driver.applies(self.knobs, self.explicit)
        K.HANDLERS.apply(self.knobs, wanted, K.Trained(self.device, self.knobs), environ=True)  # before CUDA allocates
        self.driver.check()
        K.HANDLERS.apply(self.knobs, wanted, K.Trained(self.device, self.knobs))
        self.accumulation = int(self.knobs["accumulation_steps"])
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.knobs["amp"] == "fp16")
        self._autocast = K.autocast(self.knobs, self.device)
        self.used: set[str] = set()
        # id(loader) -> its dataset, other arguments, shuffle, and the script's own loader settings
        self.made: dict[int, tuple[Any, dict[str, Any], bool, dict[str, Any]]] = {}
        self.models: list[tuple[torch.nn.Module, torch.nn.Module]] = []  # (model, module trained with)
        self.ddp: Any = None  # the DistributedDataParallel module kt.prepare made (a data-parallel rank)
        self.optimizers: list[torch.optim.Optimizer] = []
        self.prepared: list[torch.optim.Optimizer] = []  # the optimizers kt.prepare returned
        self.fused_for_scaler = False
        self.mark_step = False
        self.replays: compiled.ReplayCounter | None = None
        self.last_loader: DataLoader | None = None
        self.iterator: Any = None  # the training DataLoader's, while a trial's burst reads it
        self.ended_workers: list[int] = []
        # the step's state, set by the driver's batches and read by backward
        self.step_index = 0       # the micro-batch the next backward belongs to
        self.total_steps: int | None = None
        self.guard: LossGuard | None = None
        self.skipped = torch.zeros((), dtype=torch.float32, device=self.device)
        self.accuracy: float | None = None
        # a trainer library's integration (trainers/pytorch/huggingface.py, lightning.py): knobs its
        # library leaves alone, what autocast really did there, what it reports into ``applied``
        self.also_not_exercised: dict[str, str] = {}
        self.observed_autocast: Any = None
        self.library: Callable[[], dict[str, Any]] | None = None
        self.integration: str | None = None  # the library whose loop trains ("transformers.Trainer")
        self.variable_lengths = False  # its training samples' lengths differ (the probe says so)

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
        ensure_logging()
        settings = WatchdogSettings.from_env(watchdog_interval, watchdog_margin)
        device = distributed.device()
        from knobtune.trainers.pytorch import env

        loaded = export_knobs(path, "pytorch", version_key="torch", fingerprint=env.fingerprint,
                              defaults={**K.DEFAULTS, "batch_size": None},
                              problems=lambda knobs: K.problems(knobs, device), strict=strict)
        if loaded is None:
            return cls({}, role="default", settings=settings)
        chosen, config, knobs = loaded
        ranks = int((config.get("group") or {}).get("nproc") or 1)
        if ranks != distributed.world_size():
            how = (f"as {ranks} data-parallel ranks ({config['group']['launch']})" if ranks > 1
                   else "in one process")
            log.warning(f"{chosen} was measured {how}; this job runs {distributed.world_size()} process(es): the "
                        f"per-rank settings apply, but its speed may not hold")
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
        trained = K.prepare_model(model, self.knobs, self.device, self._data_parallel(model))
        self.models.append((model, trained))
        if compiled.uses_cuda_graphs(self.knobs["compile"], self.device):
            self.mark_step = True
            if self.replays is None:
                self.replays = self.driver.replay_counter()
        if optimizer is None:
            return trained
        self.used.add("prepare_optimizer")
        optimizer = self._optimizer(optimizer)
        self.prepared.append(optimizer)
        return trained, optimizer

    def _data_parallel(self, model: torch.nn.Module) -> Callable[[torch.nn.Module], torch.nn.Module] | None:
        """In one rank of several (a trial's group, torchrun): what wraps ``model`` in
        DistributedDataParallel with the DDP knobs; None in a single process, or when the script
        wrapped it itself."""
        if not distributed.active():
            return None
        if isinstance(model, distributed.DistributedDataParallel):
            why = "the script wrapped its model in DistributedDataParallel itself"
            self.also_not_exercised.update({name: why for name in K.DDP_KNOBS})
            return None

        def wrap(module: torch.nn.Module) -> torch.nn.Module:
            self.ddp = distributed.wrap(module, self.knobs, self.device)
            return self.ddp

        return wrap

    def _optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """``optimizer`` with the knobs' implementation (or, by default under fp16 on CUDA, fused
        for GradScaler); itself when a learning-rate scheduler already holds it."""
        impl = self.knobs["optimizer_impl"]
        wanted = impl != "default" and K.impl_used(optimizer) != impl
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
            self.driver.refuse(problem, "; running with its default implementation instead")
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
        return self.driver.batches(loader, evaluate)  # the driver's generator itself: no layer per step

    def backward(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        """Backward (loss-scaled under fp16, divided by accumulation_steps), the NaN guard's one
        device op, and the optimizer step and zero_grad once per accumulation_steps micro-batches."""
        self.used.add("backward")
        known = self.optimizers  # (the step before's, as a rule: one identity check, else the list searched)
        if not (known and optimizer is known[-1]) and not any(o is optimizer for o in known):
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
                self.driver.amp_found(self.scaler._found_inf_per_device(optimizer).values())
                self.scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    # ----------------------------------------------------------------- trainer libraries

    def training_arguments(self, args: Any) -> Any:
        """Hugging Face: ``args`` (a ``TrainingArguments``) built again with the knobs' fields
        (batch size, accumulation, DataLoader workers, bf16/fp16, tf32, torch_compile, optim); in
        a trial, training exactly the burst, with no evaluation or checkpoint inside it."""
        from knobtune.trainers.pytorch import huggingface

        return huggingface.arguments(self, args)

    def trainer(self, trainer: Any) -> Any:
        """Hugging Face: ``trainer`` (a ``Trainer`` built with ``kt.training_arguments``) with
        knobtune's callback: the measured burst in a trial, the watchdog in production, and its
        ``evaluate()`` as the accuracy."""
        from knobtune.trainers.pytorch import huggingface

        return huggingface.attach(self, trainer)

    def lightning_trainer(self, **arguments: Any) -> Any:
        """Lightning: ``lightning.Trainer(**arguments)`` with the knobs' arguments (precision,
        accumulate_grad_batches; on CUDA benchmark, deterministic) and knobtune's callback: the
        measured burst in a trial, the watchdog in production, the validation metric as the
        accuracy. The DataModule builds its training loader with ``kt.dataloader``; compile is
        ``kt.prepare(module)``."""
        from knobtune.trainers.pytorch import lightning

        return lightning.trainer(self, arguments)

    # ----------------------------------------------------------------- shared by the drivers

    def _build(self, dataset: Any, arguments: dict[str, Any], settings: dict[str, Any], shuffle: bool) -> DataLoader:
        loader_args = {**arguments, **K.loader_arguments(settings)}
        if "batch_size" not in settings:
            loader_args.pop("batch_size", None)
        return self.driver.loader(dataset, arguments, loader_args, shuffle)

    def _on_device(self, batch: Any, loader: Any) -> Any:
        if self.device.type == "cpu" and not torch.cuda.is_initialized() and not self.knobs["channels_last"]:
            return batch  # a loader's batch is on the CPU already: no tensor can be elsewhere
        non_blocking = bool(getattr(loader, "pin_memory", False)) and self.device.type == "cuda"
        batch = to_device(batch, self.device, non_blocking)
        if self.knobs["channels_last"] and "prepare" in self.used:
            batch = channels_last(batch)
        return batch

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # ----------------------------------------------------------------- what the trial applied

    def close(self) -> None:
        """Shut the DataLoader's workers down and leave sync-debug mode."""
        self.driver.close()
        self.iterator = None

    def worker_exit_codes(self) -> list[int]:
        """Exit codes of the DataLoader workers that have ended (negative: killed by that signal)."""
        workers = getattr(self.iterator, "_workers", None) or []
        return [w.exitcode for w in workers if w.exitcode is not None] or list(self.ended_workers)

    def not_exercised(self) -> dict[str, str]:
        """Knob -> why it was not applied: the script never made the call that applies it (or
        trained on a DataLoader it built itself)."""
        out = {**self.uncalled(), **self.also_not_exercised}
        trial = self.trial
        if trial is not None and trial.data is not None and id(trial.data) not in self.made:
            why = self.EXERCISED_BY["dataloader"]
            out.update({name: why[1] for name in why[0]})
        return out

    def knobs_effective(self) -> dict[str, Any]:
        """Every knob as the framework objects report it (read back, not echoed from the request)."""
        loader = self.trial.data if self.trial and self.trial.data is not None else self.last_loader
        optimizer = self.optimizers[0] if self.optimizers else (self.prepared[-1] if self.prepared else None)
        seen = loader if isinstance(loader, (DataLoader, LoaderView)) else None
        trained = K.Trained(self.device, self.knobs, loader=seen,
                          models=tuple(m for m, _ in self.models), optimizer=optimizer,
                          autocast=self.observed_autocast if self.observed_autocast is not None else self._autocast,
                          compile_report=self.compile_report(), accumulation=self.accumulation, ddp=self.ddp)
        return K.HANDLERS.read_back(trained, self.not_exercised())

    def compile_report(self) -> dict[str, Any] | None:
        return compiled.report(self.knobs["compile"], self.replays) if self.knobs["compile"] != "off" else None


def for_request(request: Request, role: str = "trial") -> Tuned:
    """The trial (or probe, or diagnosis) a child runs: its knobs, and activated for ``Tuned.load()``."""
    trial = Trial(request)
    seed = trial.request.seed  # the model's initial weights and dropout: the same for every trial
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    kt = Tuned(dict(request.knobs), role=role, trial=trial)
    activate(kt)
    return kt
