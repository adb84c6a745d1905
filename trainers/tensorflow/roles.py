"""The roles a TensorFlow ``Tuned`` plays, one driver each (the framework-free part:
trainers/common/roles.py), chosen once when the ``Tuned`` is made (``DRIVERS``):

    TrialDriver       the measured burst: warm-up, settle, windows, the NaN guard, pruning progress
    DiagnoseDriver    the input ceiling (the pipeline alone) and the compute ceiling (the step alone)
    ProbeDriver       the script's job described at its first ``kt.fit``, then the script stopped
    DefaultDriver     no config: the script's own settings, ``kt.fit`` its ``model.fit``, watched
    ProductionDriver  an export's knobs: the same fit, its rate against the confirmed one

``kt.fit`` hands its model and dataset to the driver once; the steps run inside Keras (or the
custom loop), timed by callbacks at execution boundaries. A script with its own step (``kt.step``)
loops over ``kt.batches``, the driver's generator: one item per execution of the step (a batch,
or the placeholders of ``steps_per_execution`` batches), timed by the same window timer.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Iterator

import keras
import tensorflow as tf

from knobtune.spaces.tensorflow import STEP
from knobtune.trainers.common import roles
from knobtune.trainers.common.errors import InvalidKnobs, WorkloadError
from knobtune.trainers.common.production import log
from knobtune.trainers.common.protocol import (
    BurstRecord,
    GuardReading,
    Hooks,
    Schedule,
    WindowTimer,
    drive,
    hooks_from,
    make_schedule,
)
from knobtune.trainers.common.script import ScriptDone
from knobtune.trainers.common.wire import Result
from knobtune.trainers.tensorflow import distributed
from knobtune.trainers.tensorflow import knobs as K
from knobtune.trainers.tensorflow.data import (
    build_pipeline,
    count_records,
    describe_pipeline,
    pipeline_knobs,
    read_ahead,
)
from knobtune.trainers.tensorflow.loops import CustomStep, Execution, FitTimer, StepFunction, WatchdogCallback

if TYPE_CHECKING:
    from knobtune.trainers.tensorflow.tuned import Compiled, Made, Tuned

# model.fit arguments a trial's burst decides itself (the script's own evaluation is off the clock)
BURST_OWNS = ("epochs", "initial_epoch", "steps_per_epoch", "verbose", "shuffle", "validation_data",
              "validation_split", "validation_steps", "validation_freq", "validation_batch_size")

CUSTOM_ONE_REPLICA = "knobtune's own @tf.function loop trains one replica; MirroredStrategy trains through model.fit"

# a pipeline's shuffle buffer, seed, whether it repeats, and the records in its files (when counted)
Plan = tuple[int, "int | None", bool, "int | None"]


class Driver(roles.Driver):
    """What a TensorFlow role does unless it says otherwise: one pass over the files per epoch,
    shuffled unseeded; ``kt.fit`` as the script asks."""

    kt: Tuned
    records_taken = False

    def pipeline(self, files: list[str], own: dict[str, Any], settings: dict[str, Any], train_size: int | None,
                 shuffle: bool, shuffle_buffer: int) -> Plan:
        """How ``kt.dataset`` reads ``files`` (``own``: the script's settings, ``settings``: with the knobs')."""
        return (shuffle_buffer if shuffle else 0), None, False, None

    def seeded(self, files: list[str], train_size: int | None, shuffle: bool, shuffle_buffer: int) -> Plan:
        """A child's pipeline: repeated (the burst runs across epochs), its shuffle seeded and no
        larger than its records."""
        assert self.trial is not None
        records = self.records(files, train_size)
        return (min(records, shuffle_buffer) if shuffle else 0), self.trial.request.seed, True, records

    def records(self, files: list[str], train_size: int | None) -> int:
        """Records in a child's training files: the probe counted the first pipeline's once for
        the study (the request's ``train_records``); else ``train_size``, else counted."""
        assert self.trial is not None
        counted = self.trial.request.train_records
        if counted and not self.records_taken:
            self.records_taken = True
            return int(counted)
        return int(train_size or count_records(files))

    def compiled(self, model: keras.Model | None, own: dict[str, Any]) -> None:
        """After ``kt.compile``, ``kt.optimizer`` or ``kt.step`` (``own``: the script's own settings;
        ``model``: the one compiled or whose optimizer was prepared)."""

    def fit(self, model: keras.Model, dataset: tf.data.Dataset, epochs: int, evaluate: Callable[[], float] | None,
            kwargs: dict[str, Any]) -> Any:
        raise NotImplementedError

    def batches(self, dataset: tf.data.Dataset, evaluate: Callable[[], float] | None) -> Iterator[Any]:
        raise NotImplementedError

    def watch(self) -> None:
        """The watchdog's interval boundary under a script's own step: its guard read (one sync)."""
        step = self.kt.step_function
        if step is not None and step.reading().first_bad_step is not None:
            log.warning("the step's loss became non-finite during the last watchdog interval")

    def compilations(self) -> int:
        """The script's step's traces (an interval that traced it again is not judged)."""
        step = self.kt.step_function
        return step.traces if step is not None else 0


class DefaultDriver(Driver):
    """No config: the script's own settings; ``kt.fit`` is its ``model.fit``, with the watchdog's
    callback."""

    def fit(self, model: keras.Model, dataset: tf.data.Dataset, epochs: int, evaluate: Callable[[], float] | None,
            kwargs: dict[str, Any]) -> Any:
        kt = self.kt
        kt.fit_model, kt.fit_data = model, dataset
        callbacks = list(kwargs.pop("callbacks", None) or [])
        batch = kt._batch_size(dataset)
        if batch:
            entry = kt.compiled.get(id(model))
            callbacks.append(WatchdogCallback(self.watchdog, batch, entry.guard if entry else None))
        else:
            log.warning("kt.fit: cannot tell the dataset's batch size (no batch op in its pipeline): the watchdog "
                        "does not watch this fit")
        return model.fit(dataset, epochs=epochs, callbacks=callbacks, **kwargs)

    def batches(self, dataset: tf.data.Dataset, evaluate: Callable[[], float] | None) -> Iterator[Any]:
        """One pass over ``dataset``, watched: samples counted per execution, the guard read at
        the watchdog's interval. With steps_per_execution > 1 the pass ends at the first
        execution that ran short (its count read once per execution, not per step)."""
        kt = self.kt
        kt.fit_data = dataset
        step = kt.step_function
        assert step is not None
        size = kt._batch_size(dataset) or 0
        watchdog = self.watchdog
        watchdog.resume()
        try:
            if step.execution_steps == 1:
                for batch in dataset:
                    calls = step.calls
                    yield batch
                    called(step, calls)
                    shape = getattr(next(iter(tf.nest.flatten(batch)), None), "shape", None)
                    watchdog.step(int(shape[0]) if shape is not None and shape.rank else size)  # a short last batch
                return
            iterator = iter(dataset)
            while True:
                execution = Execution(iterator, step.execution_steps)
                calls = step.calls
                yield execution.placeholders(dataset.element_spec)
                called(step, calls)
                done = int(execution.done)  # type: ignore[arg-type]
                watchdog.step(done * size)
                if done < execution.count:
                    return
        finally:
            watchdog.pause()


def called(step: StepFunction, calls: int) -> None:
    """Raise when the loop's body did not call the step with the batch it got."""
    if step.calls == calls:
        raise WorkloadError("the loop over kt.batches(...) did not call the step kt.step wrapped: call it once "
                            "per batch, with that batch (loss = step(*batch)); knobtune times and guards that step")


class ProductionDriver(DefaultDriver):
    """An export's knobs (``Tuned.load`` checked them), the same watched fit; the watchdog
    compares the live rate with the rate the export was confirmed at."""

    def compiled(self, model: keras.Model | None, own: dict[str, Any]) -> None:
        kt = self.kt
        wanted = kt.knobs["mixed_precision"]
        if model is not None and "mixed_precision" in kt.explicit and model.dtype_policy.name != wanted:
            log.warning(f"the model computes under the {model.dtype_policy.name} policy, not the loaded {wanted}: "
                        f"build it after Tuned.load(), which sets Keras' global dtype policy")


class ProbeDriver(Driver):
    """The probe: the script runs with its own settings until its first ``kt.fit``, which
    describes its job (``description``: with the settings it gave kt.dataset and kt.compile)
    and stops it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.description: dict[str, Any] = {}

    def describe(self, key: str, values: dict[str, Any]) -> None:
        """Record the script's own settings (the first value of each wins)."""
        found = self.description.setdefault(key, {})
        for name, value in values.items():
            found.setdefault(name, value)

    def pipeline(self, files: list[str], own: dict[str, Any], settings: dict[str, Any], train_size: int | None,
                 shuffle: bool, shuffle_buffer: int) -> Plan:
        self.describe("settings", own)
        return self.seeded(files, train_size, shuffle, shuffle_buffer)

    def compiled(self, model: keras.Model | None, own: dict[str, Any]) -> None:
        policy = model.dtype_policy.name if model is not None else None
        self.describe("settings", {**{k: v for k, v in own.items() if _knob_value(k, v)},
                                   **({"mixed_precision": policy} if policy in K.POLICIES[1:] else {})})

    def batches(self, dataset: tf.data.Dataset, evaluate: Callable[[], float] | None) -> Iterator[Any]:
        assert self.trial is not None
        self.trial.started = True
        kt = self.kt
        models = [m for m, _ in kt.prepared] + [c.model for c in kt.compiled.values()]
        self.description.update(models=models, dataset=dataset, made=kt._made(dataset),
                                batch_size=kt._batch_size(dataset, per_replica=True))
        # a dry run of the loop's body on the placeholders of two batches: whether it hands them to the
        # step untouched (steps_per_execution > 1 can apply) or uses them itself (it cannot)
        self.dry_run = Execution(None, 2)
        yield self.dry_run.placeholders(dataset.element_spec)
        raise ScriptDone

    dry_run: Execution | None = None

    def step_batches(self) -> dict[str, Any]:
        """What the dry run found, for the workload's description (nothing without a step)."""
        if self.dry_run is None:
            return {}
        return {"step_uses_batch": self.dry_run.refused}

    def fit(self, model: keras.Model, dataset: tf.data.Dataset, epochs: int, evaluate: Callable[[], float] | None,
            kwargs: dict[str, Any]) -> Any:
        assert self.trial is not None
        self.trial.started = True
        kt = self.kt
        self.description.update(models=[model], dataset=dataset, made=kt._made(dataset),
                                batch_size=kt._batch_size(dataset, per_replica=True))
        raise ScriptDone


class TrialDriver(roles.Measuring, Driver):
    """The trial: every knob is the trial's and checked; the pipeline repeats, seeded, and drops
    its last partial batch; the first ``kt.fit`` is the measured burst (``train_samples``,
    whatever ``epochs`` says), every later one trains nothing more."""

    history: Any = None  # the burst's

    def check(self) -> None:
        K.check(self.kt.knobs, self.kt.hardware)

    def pipeline(self, files: list[str], own: dict[str, Any], settings: dict[str, Any], train_size: int | None,
                 shuffle: bool, shuffle_buffer: int) -> Plan:
        plan = self.seeded(files, train_size, shuffle, shuffle_buffer)
        records, replicas = plan[3], self.kt.replicas
        if records is not None and records < settings["batch_size"] * replicas:
            raise InvalidKnobs(f"batch_size={settings['batch_size']}"
                               + (f" x {replicas} replicas" if replicas > 1 else "")
                               + f" is larger than the training set ({records} samples)")
        return plan

    def start(self, dataset: tf.data.Dataset, accumulation: int, execution: int, model: keras.Model | None = None
              ) -> tuple[Schedule, Made | None, tf.data.Dataset] | None:
        """The burst's schedule (``accumulation`` micro-batches per optimizer step, ``execution``
        steps per host call), the pipeline ``kt.dataset`` built (None: another) and the data it
        trains on (repeated); None when the burst already ran. ``model``: kt.fit's."""
        trial, kt = self.trial, self.kt
        if trial.started:
            return None
        trial.started = True
        trial.setup_seconds = time.perf_counter() - kt.created
        kt.fit_model, kt.fit_data = model, dataset
        batch = kt._batch_size(dataset)
        if batch is None:
            raise WorkloadError("the training dataset: cannot tell its batch size (no batch op in its pipeline); "
                                "build it with kt.dataset(...)")
        made = kt._made(dataset)
        data = trial.data = dataset if made is not None else dataset.repeat()  # the burst runs across epochs
        ahead = read_ahead({**pipeline_knobs(describe_pipeline(data)), "batch_size": batch})
        schedule = trial.schedule = make_schedule(trial.request.burst, batch, accumulation, execution,
                                                  read_ahead=ahead)
        return schedule, made, data

    def hooks(self, evaluate: Callable[[], float] | None, call: str) -> Hooks:
        """The burst's hooks; time-to-accuracy needs ``evaluate`` (``call``: how to pass it)."""
        if self.trial.request.target_accuracy is not None and evaluate is None:
            raise InvalidKnobs(f"time-to-accuracy needs an evaluation between windows: call {call}, fn() returning "
                               f"the held-out accuracy")
        return hooks_from(self.trial.request, evaluate or (lambda: 0.0))

    def step_schedule(self, dataset: tf.data.Dataset) -> tuple[Schedule, Made | None, tf.data.Dataset] | None:
        """``start`` for the script's own step: its optimizer's accumulation, its steps per call."""
        kt = self.kt
        assert kt.step_function is not None
        optimizer = kt.prepared[-1][1] if kt.prepared else None
        return self.start(dataset, K.accumulation(optimizer) if optimizer is not None else 1,
                          kt.step_function.execution_steps)

    def executions(self, iterator: Any, spec: Any, schedule: Schedule, timer: WindowTimer) -> Iterator[Any]:
        """The burst to the script's loop: a batch per step, or with steps_per_execution > 1 the
        placeholders of an execution's batches; each timed once the loop has handed it to the step."""
        step = self.kt.step_function
        assert step is not None
        n = schedule.execution_steps
        for first in range(0, schedule.total_steps, n):
            count = min(n, schedule.total_steps - first)
            calls = step.calls
            yield next(iterator) if n == 1 else Execution(iterator, count).placeholders(spec)
            called(step, calls)
            if not timer.passed(first + count, count * schedule.batch_size, step.reading):
                return

    def batches(self, dataset: tf.data.Dataset, evaluate: Callable[[], float] | None) -> Iterator[Any]:
        started = self.step_schedule(dataset)
        if started is None:
            return  # the burst ran in the first call; the script's other epochs are not trained
        schedule, _, data = started
        trial, step = self.trial, self.kt.step_function
        assert step is not None
        hooks = self.hooks(evaluate, "kt.batches(dataset, evaluate=fn)")
        progress = hooks.progress

        def stamped(segment: dict[str, Any]) -> None:  # the windows begin after the last other segment
            if segment["phase"] != "windows":
                self.window_mark = (step.traces, step.calls)
            if progress is not None:
                progress(segment)

        timer = trial.timer = WindowTimer(schedule, hooks=replace(hooks, progress=stamped))
        trial.record = timer.record
        try:
            timer.start()  # before the iterator is made: the pipeline's start-up is warm-up
            yield from self.executions(iter(data), data.element_spec, schedule, timer)
            record = timer.record
            trial.completed = (record.steps_done >= schedule.total_steps or record.nan_step is not None
                               or bool(record.target_reached))
        finally:
            if not trial.completed:
                trial.stopped_at = timer.record.steps_done
            trial.burst_end = time.perf_counter()

    window_mark = (0, 0)  # the step's (traces, calls) when the measured windows began

    def retraced(self) -> dict[str, Any]:
        """The step's traces and calls in the measured windows, and the verdict: a step traced
        again on every call there measured its tracing, not the knobs (the outcome is invalid)."""
        step = self.kt.step_function
        if step is None or self.trial.record is None or not self.trial.record.windows:
            return {}
        traces, calls = step.traces - self.window_mark[0], step.calls - self.window_mark[1]
        out: dict[str, Any] = {"step_traces_in_windows": traces, "step_calls_in_windows": calls}
        if calls and traces >= calls:
            out["failure"] = (f"the step kt.step wraps was traced again on every call in the measured windows "
                              f"({traces} traces in {calls} calls, {step.traces} in all): each call rebuilt its "
                              f"graph, so the windows measured Python tracing, not the knobs. Pass tensors, not "
                              f"Python numbers or new objects, to the step, and keep Python side effects "
                              f"(print, list.append) out of it (tf.print, tf.TensorArray)")
        elif traces:
            log.warning(f"the step was traced again {traces} time(s) in {calls} calls of the measured windows")
        return out

    def fit(self, model: keras.Model, dataset: tf.data.Dataset, epochs: int, evaluate: Callable[[], float] | None,
            kwargs: dict[str, Any]) -> Any:
        started = self.start(dataset, K.accumulation(model.optimizer), int(model.steps_per_execution), model)
        if started is None:
            return self.history  # the burst ran in the first call; the script's other epochs are not trained
        schedule, _, data = started
        trial, kt = self.trial, self.kt
        hooks = self.hooks(evaluate, "kt.fit(model, dataset, evaluate=fn)")
        try:
            if kt.knobs["loop"] == "custom" and not trial.script:
                if kt.strategy is not None:
                    raise InvalidKnobs(f"loop='custom': {CUSTOM_ONE_REPLICA}")
                record = self.custom(model, data, schedule, hooks)
                self.history = keras.callbacks.History()
                self.history.history = {"loss": [record.final_loss]}
            else:
                timer = FitTimer(schedule, hooks)
                trial.timer = timer.timer
                rest = {k: v for k, v in kwargs.items() if k not in BURST_OWNS and k != "callbacks"}
                callbacks = [*(kwargs.get("callbacks") or []), timer]
                self.history = model.fit(data, epochs=1, steps_per_epoch=schedule.total_steps, verbose=0,
                                         callbacks=callbacks, shuffle=False, **rest)
                record = timer.timer.record
        except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as exc:
            raise K.rejected(exc, kt.knobs) from None
        finally:
            trial.burst_end = time.perf_counter()
        trial.record = record
        trial.completed = (record.steps_done >= schedule.total_steps or record.nan_step is not None
                           or bool(record.target_reached))
        if not trial.completed:
            trial.stopped_at = record.steps_done
        return self.history

    def compiled_by_kt(self, model: keras.Model, why: str) -> Compiled:
        """What kt.compile gave ``model``: knobtune's own ``@tf.function`` step needs its loss and optimizer."""
        entry = self.kt.compiled.get(id(model))
        if entry is None:
            raise WorkloadError(f"{why} trains the model with knobtune's @tf.function step, which needs its loss and "
                                f"optimizer: compile it with kt.compile(model, optimizer=..., loss=...)")
        return entry

    def custom(self, model: keras.Model, data: tf.data.Dataset, schedule: Schedule, hooks: Any) -> BurstRecord:
        """The burst under knobtune's own ``@tf.function`` loop (``loop='custom'``)."""
        entry = self.compiled_by_kt(model, "loop='custom'")
        train = self.kt.custom = CustomStep(model, entry.loss, entry.optimizer, bool(model.jit_compile),
                                            model.dtype_policy.name)
        return drive(schedule, train.executor(data, schedule.batch_size), train.checkpoint, hooks=hooks)

    def result(self) -> Result:
        """Measurements, knobs read back, what was applied, accuracy and the outcome."""
        kt = self.kt
        trial = kt.result_check()
        schedule = trial.schedule
        assert schedule is not None and trial.data is not None
        model, optimizer = kt.trained_with()
        step = kt.step_function if kt.fit_model is None else None  # the script's own step trained the burst
        made = kt._made(kt.fit_data)
        pipeline = describe_pipeline(trial.data)
        effective = kt.knobs_effective()
        function = step or (kt.custom.function if kt.custom is not None else None)
        retraced = self.retraced() if step is not None else {}
        applied = {
            "device": "gpu" if kt.gpu else "cpu",
            "policy": model.dtype_policy.name if model is not None else keras.mixed_precision.global_policy().name,
            "loss_scale_optimizer": isinstance(optimizer, keras.optimizers.LossScaleOptimizer),
            "jit_compile": step.jit_used if step is not None else bool(model.jit_compile),
            "steps_per_execution": schedule.execution_steps,
            "accumulation_steps": schedule.accumulation_steps,
            "loop": STEP if step is not None else effective.get("loop", "fit"),
            **({"integration": STEP} if step is not None else {}),  # (the export's snippet is the step's)
            "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
            "learning_rate": K.learning_rate(optimizer),
            "tf32": effective["tf32"],
            "xla_auto_clustering": effective["xla_auto_clustering"],
            "gpu_thread_mode": effective["gpu_thread_mode"],
            "shuffle_buffer": made.shuffle_buffer if made is not None else None,
            "read_ahead_batches": read_ahead({**pipeline_knobs(pipeline), "batch_size": schedule.batch_size}),
            "eval_batch_size": trial.metrics.get("eval_batch_size"),
            **(function.report() if function is not None else {}),
            **{k: v for k, v in retraced.items() if k != "failure"},
        }
        stopped = ("the script's training stopped after {done} of the burst's {total} micro-batches "
                   + ("(it left its loop over kt.batches early); kt.batches yields the whole burst by itself"
                      if step is not None else
                      "(a callback set model.stop_training?); kt.fit trains the whole burst by itself"))
        outcome = self.outcome(stopped)
        if "failure" in retraced and outcome["outcome"] == "ok":
            outcome = {"outcome": "invalid", "failure": retraced["failure"], "eval_seconds": outcome["eval_seconds"]}
        scaled = id(model) in kt.compiled or any(m is model for m, _ in kt.prepared)
        group = ({"nproc": kt.replicas, **distributed.read_back(kt.strategy)} if kt.strategy is not None else None)
        return Result(**(trial.record.measurement() if trial.record is not None else {}), knobs_effective=effective,
                      not_exercised=kt.not_exercised(), setup_seconds=trial.setup_seconds,
                      effective_batch_size=schedule.batch_size * schedule.accumulation_steps,
                      lr_scale=kt.lr_scale if scaled else 1.0, pipeline=pipeline, applied=applied,
                      amp_skipped_steps=int(function.skipped.numpy()) if function is not None else None,
                      **outcome, peak_memory_mb=K.peak_memory_mb(kt.gpu), memory_limit_mb=K.memory_limit_mb(kt.gpu),
                      group=group)


class DiagnoseDriver(roles.Diagnosing, TrialDriver):
    """The bottleneck diagnosis, in place of the burst: the input ceiling (the pipeline alone,
    per variant) and the compute ceiling (the train step under @tf.function on one batch
    already on the device, with the trial's XLA, dtype policy and accumulation), each timed
    with the burst's own schedule; then the script is stopped (its evaluation is not needed)."""

    def fit(self, model: keras.Model, dataset: tf.data.Dataset, epochs: int, evaluate: Callable[[], float] | None,
            kwargs: dict[str, Any]) -> Any:
        started = self.start(dataset, K.accumulation(model.optimizer), int(model.steps_per_execution), model)
        if started is None:
            return self.history
        schedule, made, data = started
        trial = self.trial
        entry = self.compiled_by_kt(model, "the diagnosis")
        inputs = self.input_ceilings(made, schedule)
        x, y = next(iter(data))
        train = CustomStep(model, entry.loss, entry.optimizer, bool(model.jit_compile), model.dtype_policy.name)

        @tf.function
        def repeat(count: tf.Tensor) -> None:
            for _ in tf.range(count):
                train.step_fn(x, y)

        def step(first: int, count: int) -> int:
            repeat(tf.constant(count, tf.int64))
            return count * schedule.batch_size

        record = drive(schedule, step, train.checkpoint)
        self.ceilings(inputs, float(record.measurement()["samples_per_second"]))
        trial.completed = True
        trial.burst_end = time.perf_counter()
        raise ScriptDone

    def batches(self, dataset: tf.data.Dataset, evaluate: Callable[[], float] | None) -> Iterator[Any]:
        """The ceilings of a script with its own step: the input's as for kt.fit; the compute's
        its own loop over one batch, already made, handed to its step again and again (with
        steps_per_execution > 1 pulled inside the step from a dataset of that batch)."""
        started = self.step_schedule(dataset)
        if started is None:
            return
        schedule, made, data = started
        inputs = self.input_ceilings(made, schedule)
        batch = next(iter(data))
        same = (itertools.repeat(batch) if schedule.execution_steps == 1
                else iter(tf.data.Dataset.from_tensors(batch).repeat()))
        timer = WindowTimer(schedule)
        timer.start()
        yield from self.executions(same, data.element_spec, schedule, timer)
        self.ceilings(inputs, float(timer.record.measurement()["samples_per_second"]))
        self.trial.completed = True
        self.trial.burst_end = time.perf_counter()
        raise ScriptDone

    def input_ceilings(self, made: Made | None, schedule: Schedule) -> dict[str, float]:
        """The input ceiling of each variant the request names (the pipeline rebuilt with it)."""
        if made is None:
            raise WorkloadError("the diagnosis rebuilds the input pipeline with other settings: build it with "
                                "kt.dataset(...)")
        variants = self.trial.request.input_variants or {"as configured": {}}
        return {label: self.input_ceiling(made, overrides, schedule) for label, overrides in variants.items()}

    def input_ceiling(self, made: Made, overrides: dict[str, Any], schedule: Schedule) -> float:
        settings = {**made.settings, **{k: v for k, v in overrides.items() if k in K.PIPELINE_KNOBS}}
        ds = build_pipeline(made.files, made.parse_fn, made.augment_fn, settings, made.shuffle_buffer, made.seed,
                            repeat=True)
        plain = make_schedule(self.trial.request.burst, schedule.batch_size, schedule.accumulation_steps,
                              schedule.execution_steps, read_ahead=read_ahead(settings))
        iterator = iter(ds)

        def load_only(first: int, count: int) -> int:
            for _ in range(count):
                next(iterator)
            return count * schedule.batch_size

        record = drive(plain, load_only, lambda: GuardReading(True, None, None))
        return float(record.measurement()["samples_per_second"])


def _knob_value(name: str, value: Any) -> bool:
    """Whether a script's own compile setting is a value the knob can take (the study's baseline)."""
    if name == "jit_compile":
        return isinstance(value, bool)
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


DRIVERS: dict[str, type[Driver]] = {"trial": TrialDriver, "diagnose": DiagnoseDriver, "probe": ProbeDriver,
                                    "default": DefaultDriver, "production": ProductionDriver}
