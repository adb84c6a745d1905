"""The roles a PyTorch ``Tuned`` plays, one driver each (the framework-free part:
trainers/common/roles.py), chosen once when the ``Tuned`` is made (``DRIVERS``):

    TrialDriver       the measured burst: warm-up, settle, windows, the NaN guard, pruning progress
    DiagnoseDriver    the input ceiling (the loader alone) and the compute ceiling (the step alone)
    ProbeDriver       the script's job described at its first batch, then the script stopped
    DefaultDriver     no config: the script's own settings, each ``kt.batches`` one watched pass
    ProductionDriver  an export's knobs: the same pass, its rate against the confirmed one

A driver's ``batches`` is the generator the script iterates, handed out as it is: a step costs
no call more than the loop itself.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

from knobtune.trainers.common import roles
from knobtune.trainers.common.errors import InvalidKnobs, WorkloadError
from knobtune.trainers.common.production import log
from knobtune.trainers.common.protocol import (
    GuardReading,
    Schedule,
    WindowTimer,
    drive,
    group_reading,
    hooks_from,
    make_schedule,
)
from knobtune.trainers.common.script import ScriptDone
from knobtune.trainers.common.wire import Result
from knobtune.trainers.pytorch import compiled, distributed
from knobtune.trainers.pytorch import knobs as K
from knobtune.trainers.pytorch.data import SeededSampler
from knobtune.trainers.pytorch.loops import LoaderView, LossGuard, count

if TYPE_CHECKING:
    from knobtune.trainers.pytorch.tuned import Tuned


def make_loader(dataset: Any, arguments: dict[str, Any]) -> DataLoader:
    try:
        return DataLoader(dataset, **arguments)
    except (TypeError, ValueError) as exc:
        raise WorkloadError(f"kt.dataloader(...): {exc}") from None


def _shardable(dataset: Any, arguments: dict[str, Any]) -> bool:
    """Whether knobtune can give each data-parallel rank its shard: a map-style dataset, read in
    the loader's own order (a script's sampler or batch_sampler, an IterableDataset: its own business)."""
    return not isinstance(dataset, IterableDataset) and "sampler" not in arguments and "batch_sampler" not in arguments


def _unsharded(dataset: Any, arguments: dict[str, Any]) -> str:
    what = ("an IterableDataset" if isinstance(dataset, IterableDataset) else
            f"its own {'batch_sampler' if 'batch_sampler' in arguments else 'sampler'}")
    return (f"kt.dataloader(...) in a data-parallel trial: the training set comes with {what}, so knobtune cannot give "
            f"each rank its shard; pass a map-style dataset and shuffle=True, and kt.dataloader shards it")


class Driver(roles.Driver):
    """What a PyTorch role does unless it says otherwise: the knobs the script or the export set,
    a plain shuffled loader, the skipped fp16 steps as a running sum."""

    kt: Tuned

    def applies(self, knobs: dict[str, Any], explicit: set[str]) -> set[str]:
        """The knobs to apply: without a config the script's own settings (cuDNN flags, matmul
        precision, threads it set itself) stay as they are."""
        return explicit

    def loader(self, dataset: Any, arguments: dict[str, Any], loader_args: dict[str, Any],
               shuffle: bool) -> DataLoader:
        """The training DataLoader (``arguments``: the script's own, ``loader_args``: with the knobs')."""
        if distributed.active() and _shardable(dataset, arguments):
            loader_args["sampler"] = DistributedSampler(dataset, distributed.world_size(), distributed.rank(),
                                                        shuffle=shuffle)
        elif shuffle and not isinstance(dataset, IterableDataset):
            loader_args["shuffle"] = True
        return make_loader(dataset, loader_args)

    def replay_counter(self) -> compiled.ReplayCounter | None:
        """What counts CUDA graph replays under reduce-overhead (a trial's report)."""
        return None

    def amp_found(self, found: Any) -> None:
        """GradScaler's found-inf flags of one optimizer step: a long job keeps a running sum, not
        a list that grows every step."""
        for flag in found:
            self.kt.skipped += flag

    def batches(self, loader: Any, evaluate: Callable[[], float] | None) -> Iterator[Any]:
        raise NotImplementedError

    # A trainer library's own loop (Hugging Face's Trainer, Lightning) calls these from its
    # callback, in place of iterating kt.batches: loop_begin when it starts training on
    # ``loader``; loop_step after every ``per_call`` micro-batches, ``done`` trained so far and
    # ``samples`` since the last call (False: stop training); loop_end when its loop ends.

    def loop_begin(self, loader: Any, per_call: int = 1) -> None:
        raise NotImplementedError

    def loop_step(self, done: int, samples: int) -> bool:
        return True

    def loop_end(self) -> None:
        """The library's loop ended."""


class DefaultDriver(Driver):
    """No config: the script's own settings; each ``kt.batches`` is one pass over the loader,
    watched (samples/s between device syncs at the watchdog's interval, the guard read there)."""

    micro_batches = 0  # micro-batches so far, across passes
    passes = 0  # kt.batches passes so far

    def watch(self) -> None:
        """The watchdog's interval boundary: one sync, and the guard's sum read."""
        kt = self.kt
        kt.sync()
        if kt.guard is not None:
            finite, _, _ = kt.guard.read()
            if not finite:
                log.warning("the loss became non-finite during the last watchdog interval")

    def compilations(self) -> int:
        return compiled.compilations()

    def batches(self, loader: Any, evaluate: Callable[[], float] | None) -> Iterator[Any]:
        kt = self.kt
        if kt.guard is None:
            kt.guard = LossGuard(1024, kt.device)  # a ring: read at each watchdog interval
        watchdog = self.watchdog
        watchdog.resume()
        sampler = getattr(loader, "sampler", None)
        if isinstance(sampler, DistributedSampler):  # a new order each pass, the same on every rank
            sampler.set_epoch(self.passes)
        self.passes += 1
        try:
            for batch in loader:
                batch = kt._on_device(batch, loader)
                kt.step_index = self.micro_batches
                self.micro_batches += 1
                if kt.mark_step:
                    torch.compiler.cudagraph_mark_step_begin()
                yield batch
                watchdog.step(count(batch))
        finally:
            watchdog.pause()

    def loop_begin(self, loader: Any, per_call: int = 1) -> None:
        kt = self.kt
        if kt.guard is None:
            kt.guard = LossGuard(1024, kt.device)
        self.watchdog.resume()

    def loop_step(self, done: int, samples: int) -> bool:
        self.watchdog.step(samples)
        return True

    def loop_end(self) -> None:
        self.watchdog.pause()


class ProductionDriver(DefaultDriver):
    """An export's knobs (``Tuned.load`` checked them), the same watched pass; the watchdog
    compares the live rate with the rate the export was confirmed at."""


class ProbeDriver(Driver):
    """The probe: the script runs with its own settings until its first ``kt.batches``, which
    describes its job (``description``) and stops it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.description: dict[str, Any] = {}

    def batches(self, loader: Any, evaluate: Callable[[], float] | None) -> Iterator[Any]:
        self.loop_begin(loader)
        yield  # pragma: no cover - makes this a generator

    def loop_begin(self, loader: Any, per_call: int = 1) -> None:
        assert self.trial is not None
        self.trial.started = True
        kt, description = self.kt, self.description
        description["loader_batch_size"] = getattr(loader, "batch_size", None)
        # the loader the burst would train on: its dataset, and the settings the script gave it
        made = kt.made.get(id(loader))
        description["dataset"] = made[0] if made else getattr(loader, "dataset", None)
        description["settings"] = made[3] if made else {}
        description["models"] = [model for model, _ in kt.models]
        raise ScriptDone


class TrialDriver(roles.Measuring, Driver):
    """The trial: every knob is the trial's and checked; the loader is seeded (order and
    augmentation independent of the workers) and drops its last partial batch; the first
    ``kt.batches`` is the measured burst (warm-up, settle, windows over ``train_samples``, epoch
    after epoch), every later one yields nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.found_inf: list[torch.Tensor] = []  # read at the segment boundary
        self.sync_debug = bool(self.trial.request.sync_debug) and self.kt.device.type == "cuda"

    def applies(self, knobs: dict[str, Any], explicit: set[str]) -> set[str]:
        return set(knobs)

    def check(self) -> None:
        K.check(self.kt.knobs, self.kt.device)

    def loader(self, dataset: Any, arguments: dict[str, Any], loader_args: dict[str, Any],
               shuffle: bool) -> DataLoader:
        iterable = isinstance(dataset, IterableDataset)
        seed = self.trial.request.seed
        group = distributed.active()
        if group and not _shardable(dataset, arguments):
            raise WorkloadError(_unsharded(dataset, arguments))
        if shuffle and not iterable and "sampler" not in arguments and "batch_sampler" not in arguments:
            # order and augmentation independent of num_workers; in a group, this rank's shard of the order
            loader_args["sampler"] = SeededSampler(len(dataset), seed, distributed.rank(), distributed.world_size())
        elif group:  # the dataset's own order, every world_size-th sample from this rank's
            loader_args["sampler"] = DistributedSampler(dataset, distributed.world_size(), distributed.rank(),
                                                        shuffle=False, drop_last=True)
        elif shuffle and not iterable:
            loader_args["shuffle"] = True
        # the workers' base seed comes from this generator; without it the loader draws it from
        # torch's global RNG, and dropout in the training process would get another stream with
        # workers than without
        loader_args.setdefault("generator", torch.Generator().manual_seed(seed))
        if "batch_sampler" not in arguments:
            loader_args["drop_last"] = True  # every step the same shape: no recompiles, honest windows
        loader = make_loader(dataset, loader_args)
        if not iterable and len(loader) == 0:
            raise InvalidKnobs(f"batch_size={loader.batch_size} is larger than the training set "
                               f"({len(dataset)} samples)")
        return loader

    def replay_counter(self) -> compiled.ReplayCounter | None:
        return compiled.ReplayCounter()

    def amp_found(self, found: Any) -> None:
        self.found_inf.extend(found)

    # ----------------------------------------------------------------- the burst

    def start(self, loader: Any, per_call: int = 1) -> Schedule | None:
        """The burst's schedule over ``loader``; None when it already ran (the script's other
        epochs are not trained). ``per_call``: micro-batches between two calls of ``passed`` (a
        trainer library's callback sees whole optimizer steps)."""
        trial, kt = self.trial, self.kt
        if trial.started:
            return None
        trial.started = True
        trial.setup_seconds = time.perf_counter() - kt.created
        trial.data = loader
        schedule = trial.schedule = self.schedule(loader, per_call=per_call)
        kt.total_steps = schedule.total_steps
        kt.guard = LossGuard(schedule.total_steps, kt.device)
        return schedule

    def open(self, loader: Any, evaluate: Callable[[], float] | None, per_call: int = 1,
             drained: Callable[[], bool | None] | None = None) -> WindowTimer | None:
        """Start the burst over ``loader``: its schedule, guard and timer, the clock running; None
        when it already ran."""
        schedule = self.start(loader, per_call)
        if schedule is None:
            return None
        trial, kt = self.trial, self.kt
        target = trial.request.target_accuracy
        if target is not None and evaluate is None:
            raise InvalidKnobs("time-to-accuracy needs an evaluation between windows: iterate "
                               "kt.batches(loader, evaluate=fn), fn() returning the held-out accuracy")
        ranks = distributed.world_size()
        hooks = hooks_from(trial.request, self.evaluator(evaluate) if evaluate else (lambda: 0.0), ranks)
        if ranks > 1 and drained is None:
            # every rank settles for the same micro-batches (its read-ahead), so the windows stay aligned
            drained = lambda: None  # noqa: E731
        timer = trial.timer = WindowTimer(schedule, hooks=hooks, drained=drained or self.drained)
        trial.record = timer.record
        if kt.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(kt.device)
        for model, _ in kt.models:
            model.train()
        timer.start()
        return timer

    def shut(self, done: int) -> None:
        """The burst is over after ``done`` micro-batches: complete when the schedule ran out, a
        loss went non-finite or the target was reached; else stopped early."""
        trial = self.trial
        record = trial.record
        assert record is not None
        trial.completed = trial.completed or record.nan_step is not None or bool(record.target_reached)
        if not trial.completed:
            trial.stopped_at = done
        self.end_burst()

    def batches(self, loader: Any, evaluate: Callable[[], float] | None) -> Iterator[Any]:
        timer = self.open(loader, evaluate)
        if timer is None:
            return
        trial, kt = self.trial, self.kt
        schedule = trial.schedule
        assert schedule is not None
        done = 0
        try:
            for i, batch in enumerate(self.endless(loader, schedule.total_steps)):
                kt.step_index = i
                if kt.mark_step:
                    torch.compiler.cudagraph_mark_step_begin()
                yield batch
                done = i + 1
                if "backward" not in kt.used:
                    raise WorkloadError("the training loop never calls kt.backward(loss, optimizer): knobtune "
                                        "needs it for the step, accumulation and the NaN guard")
                if not timer.passed(i + 1, count(batch), self.checkpoint):
                    break
            else:
                trial.completed = True
        finally:
            self.shut(done)

    # ----------------------------------------------------------------- a trainer library's loop

    def loop_begin(self, loader: Any, per_call: int = 1) -> None:
        workers = int(getattr(loader, "num_workers", 0) or 0)
        # the library iterates the loader itself: its read-ahead cannot be counted, so the settle
        # trains through it in full
        self.open(loader, None, per_call, drained=lambda: True if workers == 0 else None)

    def loop_step(self, done: int, samples: int) -> bool:
        trial = self.trial
        timer, schedule = trial.timer, trial.schedule
        if timer is None or schedule is None or trial.burst_end is not None:
            return False
        go_on = timer.passed(done, samples, self.checkpoint)
        if go_on and done >= schedule.total_steps:
            trial.completed, go_on = True, False
        if not go_on:
            self.shut(done)
        return go_on

    def loop_end(self) -> None:
        trial = self.trial
        if trial.timer is not None and trial.burst_end is None:
            self.shut(trial.timer.record.steps_done)

    def end_burst(self) -> None:
        kt = self.kt
        self.trial.burst_end = time.perf_counter()
        if self.sync_debug:
            torch.cuda.set_sync_debug_mode("default")
        kt.ended_workers = kt.worker_exit_codes()  # an OOM kill is classified from these
        kt.iterator = None  # shuts the DataLoader's workers down

    def schedule(self, loader: Any, read_ahead: bool = True, per_call: int = 1) -> Schedule:
        batch_size = getattr(loader, "batch_size", None)
        if not batch_size:
            raise WorkloadError("kt.batches(loader): the loader has no batch_size (a batch_sampler's batches have "
                                "no fixed size to tune); build it with kt.dataloader(dataset, ...)")
        ahead = K.read_ahead({"num_workers": getattr(loader, "num_workers", 0),
                              "prefetch_factor": getattr(loader, "prefetch_factor", None)}) if read_ahead else 0
        return make_schedule(self.trial.request.burst, int(batch_size), self.kt.accumulation, execution_steps=per_call,
                             read_ahead=ahead)

    def endless(self, loader: Any, steps: int) -> Iterator[Any]:
        """``steps`` batches from ``loader``, on the device, epoch after epoch."""
        kt = self.kt
        done, fresh = 0, False
        while done < steps:
            if kt.iterator is None:
                kt.iterator, fresh = iter(loader), True
            try:
                batch = next(kt.iterator)
            except StopIteration:
                kt.iterator = None
                if fresh:
                    raise WorkloadError("the training DataLoader gave no batch at all") from None
                continue
            fresh = False
            done += 1
            yield kt._on_device(batch, loader)

    def drained(self) -> bool | None:
        """Whether the DataLoader's read-ahead is used up (at most one batch waiting); None when
        it cannot be counted. Single-process loading has no read-ahead."""
        iterator = self.kt.iterator
        if iterator is None or getattr(iterator, "_num_workers", 0) == 0:
            return True
        ready = K.ready_batches(iterator)
        return None if ready is None else ready <= 1

    def evaluator(self, evaluate: Callable[[], float]) -> Callable[[], float]:
        def score() -> float:
            if self.sync_debug:
                torch.cuda.set_sync_debug_mode("default")
            modes = [(m, m.training) for m, _ in self.kt.models]
            value = float(evaluate())
            for model, training in modes:
                model.train(training)
            if self.sync_debug:
                torch.cuda.set_sync_debug_mode("error")
            return value

        return score

    def checkpoint(self) -> GuardReading:
        """A segment boundary: synchronise, then read the segment's losses (one sum)."""
        kt = self.kt
        if self.sync_debug:
            torch.cuda.set_sync_debug_mode("default")
        kt.sync()
        if self.found_inf:
            kt.skipped += torch.stack(self.found_inf).float().sum()
            self.found_inf = []
        finite, first_bad, mean = kt.guard.read() if kt.guard is not None else (True, None, None)
        if distributed.active():  # every rank's guard counts; the collective also aligns the ranks' boundaries
            finite, first_bad, mean = group_reading(distributed.gathered((finite, first_bad, mean)))
        if self.sync_debug:  # every segment after warm-up must run without a host-device sync
            torch.cuda.set_sync_debug_mode("error")
        return GuardReading(finite=finite, first_bad_step=first_bad, mean_loss=mean)

    def close(self) -> None:
        if self.sync_debug:
            torch.cuda.set_sync_debug_mode("default")

    # ----------------------------------------------------------------- the result

    def result(self) -> Result:
        """Measurements, knobs read back, what was applied, accuracy and the outcome."""
        kt = self.kt
        trial = kt.result_check()
        timer, schedule = trial.timer, trial.schedule
        assert timer is not None and schedule is not None
        loader = trial.data
        optimizer = kt.optimizers[0] if kt.optimizers else None
        effective = kt.knobs_effective()
        applied = {
            "device": kt.device.type,
            "autocast_dtype": str(K.AMP_DTYPES[kt.knobs["amp"]]).replace("torch.", "")
            if kt.knobs["amp"] != "off" and "autocast" in kt.used else None,
            "grad_scaler": kt.scaler.is_enabled(),
            "fused_optimizer_for_grad_scaler": kt.fused_for_scaler,
            "optimizer": type(optimizer).__name__ if optimizer is not None else None,
            "optimizer_impl": K.impl_used(optimizer) if optimizer is not None else None,
            "per_step_sync": K.per_step_sync(kt.scaler, optimizer),
            "compile_mode": kt.knobs["compile"],
            "compiled": any(hasattr(t, "_orig_mod") for _, t in kt.models),  # torch.compile's wrapper
            "compile_report": kt.compile_report(),
            "channels_last": effective.get("channels_last", False),
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "cudnn_deterministic": torch.backends.cudnn.deterministic,
            "matmul_precision": torch.get_float32_matmul_precision(),
            # PyTorch's own default: cuDNN convolutions in TF32 (matmuls follow matmul_precision)
            "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32) if kt.device.type == "cuda" else None,
            "accumulation_steps": kt.accumulation,
            "torch_threads": torch.get_num_threads(),
            "learning_rate": optimizer.param_groups[0]["lr"] if optimizer is not None else None,
            "read_ahead_batches": K.read_ahead({"num_workers": getattr(loader, "num_workers", 0),
                                                "prefetch_factor": getattr(loader, "prefetch_factor", None)}),
            "eval_batch_size": trial.metrics.get("eval_batch_size"),
            **({"reported_metrics": dict(trial.metrics)} if trial.metrics else {}),
            **(kt.library() if kt.library is not None else {}),
        }
        outcome = self.outcome("the script stopped iterating kt.batches(...) after {done} of the burst's {total} "
                               "micro-batches (the burst continues across epochs by itself)")
        return Result(**timer.record.measurement(), knobs_effective=effective, not_exercised=kt.not_exercised(),
                      setup_seconds=trial.setup_seconds, effective_batch_size=schedule.batch_size * kt.accumulation,
                      lr_scale=kt.lr_scale, amp_skipped_steps=int(kt.skipped.item()), applied=applied,
                      loader=K.loader_report(loader) if isinstance(loader, (DataLoader, LoaderView)) else None, **outcome,
                      peak_memory_mb=K.peak_memory_mb(kt.device), memory_limit_mb=K.memory_limit_mb(kt.device))


class DiagnoseDriver(roles.Diagnosing, TrialDriver):
    """The bottleneck diagnosis, in place of the burst: the input ceiling (the loader alone, per
    variant) and the compute ceiling (the script's step on one batch already on the device)."""

    def loop_begin(self, loader: Any, per_call: int = 1) -> None:
        raise WorkloadError("the bottleneck diagnosis times the script's own step on one batch, which needs its loop "
                            "over kt.batches(...); a trainer library's loop (Hugging Face, Lightning) is not diagnosed")

    def batches(self, loader: Any, evaluate: Callable[[], float] | None) -> Iterator[Any]:
        if self.start(loader) is None:
            return
        trial, kt = self.trial, self.kt
        variants = trial.request.input_variants or {"as configured": {}}
        inputs = {}
        threads_before = torch.get_num_threads()
        for label, overrides in variants.items():
            threads = overrides.get("intra_op_threads")
            if threads:
                torch.set_num_threads(int(threads))
            variant = self.rebuilt(loader, overrides) if id(loader) in kt.made and overrides else loader
            inputs[label] = self.input_ceiling(variant)
            torch.set_num_threads(threads_before)  # the compute ceiling runs with the trial's threads
        batch = next(self.endless(loader, 1))
        kt.iterator = None
        plain = self.schedule(loader, read_ahead=False)
        kt.total_steps = plain.total_steps
        kt.guard = LossGuard(plain.total_steps, kt.device)
        timer = WindowTimer(plain)
        timer.start()
        for i in range(plain.total_steps):
            kt.step_index = i
            if kt.mark_step:
                torch.compiler.cudagraph_mark_step_begin()
            yield batch
            timer.passed(i + 1, count(batch), self.checkpoint)
        trial.completed = True
        self.ceilings(inputs, float(timer.record.measurement()["samples_per_second"]))

    def rebuilt(self, loader: DataLoader, overrides: dict[str, Any]) -> DataLoader:
        """``loader`` again with other loader knobs (an input variant)."""
        kt = self.kt
        dataset, arguments, shuffle, _ = kt.made[id(loader)]
        settings = {**{k: v for k, v in kt.knobs.items() if k in kt.explicit}, **overrides}
        return kt._build(dataset, arguments, settings, shuffle)

    def input_ceiling(self, loader: Any) -> float:
        schedule = self.schedule(loader)
        batches = self.endless(loader, schedule.total_steps)
        kt = self.kt

        def reading() -> GuardReading:
            kt.sync()
            return GuardReading(True, None, None)

        record = drive(schedule, lambda i, n=1: count(next(batches)), reading, drained=self.drained)
        kt.iterator = None
        return float(record.measurement()["samples_per_second"])


DRIVERS: dict[str, type[Driver]] = {"trial": TrialDriver, "diagnose": DiagnoseDriver, "probe": ProbeDriver,
                                    "default": DefaultDriver, "production": ProductionDriver}
