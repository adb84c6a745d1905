"""The roles a TensorFlow ``Tuned`` plays, one driver each (the framework-free part:
trainers/common/roles.py), chosen once when the ``Tuned`` is made (``DRIVERS``):

    TrialDriver       the measured burst: warm-up, settle, windows, the NaN guard, pruning progress
    DiagnoseDriver    the input ceiling (the pipeline alone) and the compute ceiling (the step alone)
    ProbeDriver       the script's job described at its first ``kt.fit``, then the script stopped
    DefaultDriver     no config: the script's own settings, ``kt.fit`` its ``model.fit``, watched
    ProductionDriver  an export's knobs: the same fit, its rate against the confirmed one

``kt.fit`` hands its model and dataset to the driver once; the steps run inside Keras (or the
custom loop), timed by callbacks at execution boundaries.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

import keras
import tensorflow as tf

from knobtune.trainers.common import roles
from knobtune.trainers.common.errors import InvalidKnobs, WorkloadError
from knobtune.trainers.common.production import log
from knobtune.trainers.common.protocol import BurstRecord, GuardReading, Schedule, drive, hooks_from, make_schedule
from knobtune.trainers.common.script import ScriptDone
from knobtune.trainers.common.wire import Result
from knobtune.trainers.tensorflow import knobs as K
from knobtune.trainers.tensorflow.data import (
    build_pipeline,
    count_records,
    describe_pipeline,
    pipeline_knobs,
    read_ahead,
)
from knobtune.trainers.tensorflow.loops import CustomStep, FitTimer, WatchdogCallback

if TYPE_CHECKING:
    from knobtune.trainers.tensorflow.tuned import Compiled, Made, Tuned

# model.fit arguments a trial's burst decides itself (the script's own evaluation is off the clock)
BURST_OWNS = ("epochs", "initial_epoch", "steps_per_epoch", "verbose", "shuffle", "validation_data",
              "validation_split", "validation_steps", "validation_freq", "validation_batch_size")

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

    def compiled(self, model: keras.Model, own: dict[str, Any]) -> None:
        """After ``kt.compile`` (``own``: the script's own compile settings)."""

    def fit(self, model: keras.Model, dataset: tf.data.Dataset, epochs: int, evaluate: Callable[[], float] | None,
            kwargs: dict[str, Any]) -> Any:
        raise NotImplementedError


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


class ProductionDriver(DefaultDriver):
    """An export's knobs (``Tuned.load`` checked them), the same watched fit; the watchdog
    compares the live rate with the rate the export was confirmed at."""

    def compiled(self, model: keras.Model, own: dict[str, Any]) -> None:
        kt = self.kt
        wanted = kt.knobs["mixed_precision"]
        if "mixed_precision" in kt.explicit and model.dtype_policy.name != wanted:
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

    def compiled(self, model: keras.Model, own: dict[str, Any]) -> None:
        policy = model.dtype_policy.name
        self.describe("settings", {**{k: v for k, v in own.items() if _knob_value(k, v)},
                                   **({"mixed_precision": policy} if policy in K.POLICIES[1:] else {})})

    def fit(self, model: keras.Model, dataset: tf.data.Dataset, epochs: int, evaluate: Callable[[], float] | None,
            kwargs: dict[str, Any]) -> Any:
        assert self.trial is not None
        self.trial.started = True
        kt = self.kt
        self.description.update(models=[model], dataset=dataset, made=kt._made(dataset),
                                batch_size=kt._batch_size(dataset))
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
        records = plan[3]
        if records is not None and records < settings["batch_size"]:
            raise InvalidKnobs(f"batch_size={settings['batch_size']} is larger than the training set "
                               f"({records} samples)")
        return plan

    def start(self, model: keras.Model,
              dataset: tf.data.Dataset) -> tuple[Schedule, Made | None, tf.data.Dataset] | None:
        """The burst's schedule, the pipeline ``kt.dataset`` built (None: another) and the data it
        trains on (repeated); None when the burst already ran."""
        trial, kt = self.trial, self.kt
        if trial.started:
            return None
        trial.started = True
        trial.setup_seconds = time.perf_counter() - kt.created
        kt.fit_model, kt.fit_data = model, dataset
        batch = kt._batch_size(dataset)
        if batch is None:
            raise WorkloadError("kt.fit(model, dataset): cannot tell the dataset's batch size (no batch op in its "
                                "pipeline); build it with kt.dataset(...)")
        made = kt._made(dataset)
        data = trial.data = dataset if made is not None else dataset.repeat()  # the burst runs across epochs
        ahead = read_ahead({**pipeline_knobs(describe_pipeline(data)), "batch_size": batch})
        schedule = trial.schedule = make_schedule(trial.request.burst, batch, K.accumulation(model.optimizer),
                                                  int(model.steps_per_execution), read_ahead=ahead)
        return schedule, made, data

    def fit(self, model: keras.Model, dataset: tf.data.Dataset, epochs: int, evaluate: Callable[[], float] | None,
            kwargs: dict[str, Any]) -> Any:
        started = self.start(model, dataset)
        if started is None:
            return self.history  # the burst ran in the first call; the script's other epochs are not trained
        schedule, _, data = started
        trial, kt = self.trial, self.kt
        target = trial.request.target_accuracy
        if target is not None and evaluate is None:
            raise InvalidKnobs("time-to-accuracy needs an evaluation between windows: call "
                               "kt.fit(model, dataset, evaluate=fn), fn() returning the held-out accuracy")
        hooks = hooks_from(trial.request, evaluate or (lambda: 0.0))
        try:
            if kt.knobs["loop"] == "custom" and not trial.script:
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
        schedule, model = trial.schedule, kt.fit_model
        assert schedule is not None and model is not None and trial.data is not None
        made = kt._made(kt.fit_data)
        pipeline = describe_pipeline(trial.data)
        effective = kt.knobs_effective()
        optimizer = kt.custom.optimizer if kt.custom is not None else model.optimizer
        applied = {
            "device": "gpu" if kt.gpu else "cpu",
            "policy": model.dtype_policy.name,
            "loss_scale_optimizer": isinstance(optimizer, keras.optimizers.LossScaleOptimizer),
            "jit_compile": bool(model.jit_compile),
            "steps_per_execution": schedule.execution_steps,
            "accumulation_steps": schedule.accumulation_steps,
            "loop": effective.get("loop", "fit"),
            "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
            "learning_rate": K.learning_rate(optimizer),
            "tf32": effective["tf32"],
            "xla_auto_clustering": effective["xla_auto_clustering"],
            "gpu_thread_mode": effective["gpu_thread_mode"],
            "shuffle_buffer": made.shuffle_buffer if made is not None else None,
            "read_ahead_batches": read_ahead({**pipeline_knobs(pipeline), "batch_size": schedule.batch_size}),
            "eval_batch_size": trial.metrics.get("eval_batch_size"),
        }
        outcome = self.outcome("the script's training stopped after {done} of the burst's {total} micro-batches "
                               "(a callback set model.stop_training?); kt.fit trains the whole burst by itself")
        return Result(**(trial.record.measurement() if trial.record is not None else {}), knobs_effective=effective,
                      not_exercised=kt.not_exercised(), setup_seconds=trial.setup_seconds,
                      effective_batch_size=schedule.batch_size * schedule.accumulation_steps,
                      lr_scale=kt.lr_scale if id(model) in kt.compiled else 1.0, pipeline=pipeline, applied=applied,
                      amp_skipped_steps=int(kt.custom.skipped.numpy()) if kt.custom is not None else None,
                      **outcome, peak_memory_mb=K.peak_memory_mb(kt.gpu), memory_limit_mb=K.memory_limit_mb(kt.gpu))


class DiagnoseDriver(roles.Diagnosing, TrialDriver):
    """The bottleneck diagnosis, in place of the burst: the input ceiling (the pipeline alone,
    per variant) and the compute ceiling (the train step under @tf.function on one batch
    already on the device, with the trial's XLA, dtype policy and accumulation), each timed
    with the burst's own schedule; then the script is stopped (its evaluation is not needed)."""

    def fit(self, model: keras.Model, dataset: tf.data.Dataset, epochs: int, evaluate: Callable[[], float] | None,
            kwargs: dict[str, Any]) -> Any:
        started = self.start(model, dataset)
        if started is None:
            return self.history
        schedule, made, data = started
        trial = self.trial
        if made is None:
            raise WorkloadError("the diagnosis rebuilds the input pipeline with other settings: build it with "
                                "kt.dataset(...)")
        entry = self.compiled_by_kt(model, "the diagnosis")
        variants = trial.request.input_variants or {"as configured": {}}
        inputs = {label: self.input_ceiling(made, overrides, schedule) for label, overrides in variants.items()}
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
