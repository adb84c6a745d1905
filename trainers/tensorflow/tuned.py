"""The integration API for TensorFlow (Keras 3): the few calls a training script makes so that
knobtune can tune it (inside a trial) and run the winner (in production) through the same lines::

    kt = Tuned.load()                     # first: threads and the dtype policy apply to what is built after
    ds = kt.dataset(files, parse_fn, augment_fn, batch_size=64)   # interleave, parallel maps, cache, prefetch
    model = build_model()
    kt.compile(model, optimizer=keras.optimizers.Adam(1e-3), loss=loss, metrics=["accuracy"])
    kt.fit(model, ds, epochs=10)          # XLA, steps_per_execution, accumulation, the NaN guard
    kt.report(val_accuracy=evaluate(model))

``Tuned.load()`` must come before the script builds its model: it sets the Keras global dtype
policy (``mixed_precision``), which a layer takes when it is built, and TensorFlow's intra-op
threads, which are fixed once its runtime starts.

Roles: inside a trial's child (``trial``, ``diagnose``) the knobs are the trial's and
``kt.fit`` runs the measured burst (``train_samples`` over the repeated pipeline, whatever
``epochs`` says; every later call trains nothing more); in the probe it stops the script at its
first ``kt.fit``; in production the knobs come from an export (``$KNOBTUNE_CONFIG`` or a path)
and ``kt.fit`` is the script's ``model.fit`` with a watchdog callback that compares the live
rate with the confirmed one; with neither, the script's own arguments apply. The built-in
workloads train through this same API (trainers/tensorflow/burst.py).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import keras
import tensorflow as tf

from knobtune.spaces.tensorflow import SPACE, Trained
from knobtune.trainers.common.errors import InvalidKnobs, WorkloadError
from knobtune.trainers.common.production import ConfigError, Watchdog, WatchdogSettings, ensure_logging, expected_rate, log
from knobtune.trainers.common.protocol import BurstRecord, GuardReading, Schedule, drive, hooks_from, make_schedule
from knobtune.trainers.common.script import ScriptDone
from knobtune.trainers.common.tuned import TRIAL_ROLES, Trial, TunedBase, export_knobs
from knobtune.trainers.common.wire import Request
from knobtune.trainers.tensorflow import env
from knobtune.trainers.tensorflow import knobs as K
from knobtune.trainers.tensorflow.data import (AUTOTUNE, build_pipeline, count_records, describe_pipeline, options_knobs,
                                      pipeline_knobs, read_ahead)
from knobtune.trainers.tensorflow.loops import CustomStep, FirstNonFinite, FitTimer, WatchdogCallback, with_guard

LOOP_WHY = ("the script trains through kt.fit (Keras model.fit); loop='custom' is knobtune's own @tf.function "
            "loop for its built-in workloads")
# model.fit arguments a trial's burst decides itself (the script's own evaluation is off the clock)
BURST_OWNS = ("epochs", "initial_epoch", "steps_per_epoch", "verbose", "shuffle", "validation_data",
              "validation_split", "validation_steps", "validation_freq", "validation_batch_size")

PARALLELISM = ("cycle_length", "interleave_parallel_calls", "map_parallel_calls", "prefetch")

_ACTIVE: "Tuned | None" = None  # the trial or probe this child process runs


def activate(kt: "Tuned | None") -> None:
    """Make ``kt`` what ``Tuned.load()`` returns in this process (a trial's or probe's child)."""
    global _ACTIVE
    _ACTIVE = kt


@dataclass
class Made:
    """A pipeline ``kt.dataset`` built, and what it was built from (the diagnosis rebuilds it)."""

    dataset: tf.data.Dataset
    files: list[str]
    parse_fn: Callable
    augment_fn: Callable | None
    settings: dict[str, Any]  # every pipeline knob, batch_size included
    shuffle_buffer: int
    seed: int | None
    repeat: bool
    records: int | None


@dataclass
class Compiled:
    """What ``kt.compile`` gave a model: the custom loop and the diagnosis train with these."""

    model: keras.Model
    loss: Any
    optimizer: keras.optimizers.Optimizer
    guard: FirstNonFinite | None


class Tuned(TunedBase):
    """A script's handle on knobtune. Make it with ``Tuned.load()``."""

    EXERCISED_BY = {
        "dataset": (K.PIPELINE_KNOBS, "the script's tf.data pipeline is not built by kt.dataset(...)"),
        "compile": (K.COMPILE_KNOBS, "the script never calls kt.compile(model, ...)"),
    }
    START_HINT = "does it call kt.fit(model, dataset)?"

    def __init__(self, knobs: dict[str, Any], *, role: str, explicit: set[str] | None = None,
                 trial: Trial | None = None, config: dict[str, Any] | None = None,
                 settings: WatchdogSettings | None = None) -> None:
        self.role = role
        self.knobs = {**K.DEFAULTS, "batch_size": None, **knobs}
        self.explicit = set(knobs) if explicit is None else explicit
        self.trial, self.config = trial, config
        # before env.hardware() lists the devices (which reads the environment)
        late = SPACE.apply(self.knobs, self.explicit, Trained(self.knobs), environ=True)
        self.hardware = env.hardware()
        self.gpu = bool(self.hardware["gpu"])
        self.created = time.perf_counter()
        if role in TRIAL_ROLES:
            K.check(self.knobs, self.hardware)
        first = {"gpu_thread_mode"} & self.explicit  # before anything could start TensorFlow's runtime
        unapplied = {**SPACE.apply(self.knobs, first, Trained(self.knobs, self.gpu)),
                     **SPACE.apply(self.knobs, self.explicit - first, Trained(self.knobs, self.gpu))}
        if not self.gpu:  # on a GPU the late flag only keeps XLA from clustering the ops left on the CPU
            unapplied.update(late)
        for name, why in unapplied.items():
            if role in TRIAL_ROLES:
                raise InvalidKnobs(why)
            log.warning(why)
        self.used: set[str] = set()
        self.made: list[Made] = []
        self.compiled: dict[int, Compiled] = {}  # id(model) ->
        self.fit_model: keras.Model | None = None
        self.fit_data: tf.data.Dataset | None = None
        self.custom: CustomStep | None = None  # the custom loop's step, when the burst ran one
        self.history: Any = None  # the burst's
        self._records_taken = False
        self.guarded = not trial or trial.request.guard
        self.lr_scale = trial.request.lr_scale if trial else float((config or {}).get("lr_scale") or 1.0)
        expected = expected_rate(config) if config else None
        self.watchdog = Watchdog(expected, settings or WatchdogSettings(), lambda: None)
        self.accuracy: float | None = None

    # ----------------------------------------------------------------- loading

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None, *, strict: bool = False,
             watchdog_interval: float | None = None, watchdog_margin: float = 0.2) -> "Tuned":
        """The trial's knobs inside a trial; else the export at ``path`` or ``$KNOBTUNE_CONFIG``
        (checked: its format and framework; a different machine is a warning naming the
        differences; a knob this machine cannot apply, such as mixed_float16 without a GPU,
        falls back to TensorFlow's default with a warning, or raises ConfigError with
        ``strict=True``); else the script's own settings. Call it before building the model."""
        if _ACTIVE is not None:
            if _ACTIVE.trial is not None:
                _ACTIVE.trial.loaded = True
            return _ACTIVE
        ensure_logging()
        settings = WatchdogSettings.from_env(watchdog_interval, watchdog_margin)
        hardware = env.hardware()

        def problems(knobs: dict[str, Any]) -> dict[str, str]:
            found = K.problems(knobs, hardware)
            if knobs.get("loop") == "custom":
                found["loop"] = f"loop='custom' cannot apply: {LOOP_WHY}"
            return found

        loaded = export_knobs(path, "tensorflow", version_key="tensorflow", fingerprint=env.fingerprint,
                              defaults={**K.DEFAULTS, "batch_size": None}, problems=problems, strict=strict)
        if loaded is None:
            return cls({}, role="default", settings=settings)
        _, config, knobs = loaded
        return cls(knobs, role="production", config=config, settings=settings)

    # ----------------------------------------------------------------- the calls a script makes

    def dataset(self, files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], parse_fn: Callable,
                augment_fn: Callable | None = None, *, batch_size: int | None = None, shuffle: bool = True,
                shuffle_buffer: int = 10_000, train_size: int | None = None, **pipeline: Any) -> tf.data.Dataset:
        """The tf.data pipeline over the TFRecord ``files``: interleave -> map(``parse_fn``) ->
        [cache] -> map(``augment_fn``) -> shuffle -> batch -> [prefetch, last], with the knobs'
        batch size, parallelism, cache and prefetch. The script's own ``batch_size`` and pipeline
        settings (``cycle_length``, ``interleave_parallel_calls``, ``map_parallel_calls``,
        ``prefetch``: a number, 0 for none, or ``tf.data.AUTOTUNE``; ``deterministic``, ``cache``)
        apply where no knob is set. In a trial the data repeats (the burst runs across epochs),
        the last partial batch is dropped and the shuffle is seeded; in production each ``kt.fit``
        epoch is one pass over the files. ``train_size``: the records in ``files``, when known
        (else a trial counts them). Build the training data with it (the first call in a trial is
        taken to be the training data the probe counted)."""
        self.used.add("dataset")
        unknown = sorted(set(pipeline) - set(K.PIPELINE_KNOBS))
        if unknown:
            raise WorkloadError(f"kt.dataset(...) got unexpected argument(s) {', '.join(unknown)}; its pipeline "
                                f"settings are {', '.join(K.PIPELINE_KNOBS)}")
        names = [os.fspath(files)] if isinstance(files, (str, os.PathLike)) else [os.fspath(f) for f in files]
        if not names:
            raise WorkloadError("kt.dataset(files, ...): expected TFRecord files, got none")
        # tf.data.AUTOTUNE (-1) is the knobs' "autotune"
        own = {k: AUTOTUNE if v == tf.data.AUTOTUNE and k in PARALLELISM else v for k, v in pipeline.items()}
        if batch_size is not None:
            own["batch_size"] = int(batch_size)
        settings = {**{k: K.DEFAULTS[k] for k in K.PIPELINE_KNOBS if k in K.DEFAULTS}, **own,
                    **{k: v for k, v in self.knobs.items() if k in self.explicit and k in K.PIPELINE_KNOBS}}
        if not settings.get("batch_size"):
            raise WorkloadError("kt.dataset(...): no batch size: pass batch_size=... (a trial's or the export's "
                                "batch_size replaces it)")
        trial = self.trial
        records: int | None = None
        if trial is not None:
            self._describe("settings", own)
            records = self._records(names, train_size)
            if self.role in TRIAL_ROLES and records < settings["batch_size"]:
                raise InvalidKnobs(f"batch_size={settings['batch_size']} is larger than the training set "
                                   f"({records} samples)")
            buffer = min(records, shuffle_buffer) if shuffle else 0
            seed: int | None = trial.request.seed
            repeat = True
        else:
            buffer, seed, repeat = (shuffle_buffer if shuffle else 0), None, False
        ds = build_pipeline(names, parse_fn, augment_fn, settings, buffer, seed, repeat=repeat, drop_remainder=repeat)
        self.made.append(Made(ds, names, parse_fn, augment_fn, settings, buffer, seed, repeat, records))
        return ds

    def compile(self, model: keras.Model, optimizer: Any = "rmsprop", loss: Any = None, metrics: Any = None,
                **kwargs: Any) -> keras.Model:
        """``model.compile`` with the knobs' ``jit_compile`` (XLA), ``steps_per_execution`` and
        ``accumulation_steps`` (the optimizer's gradient_accumulation_steps; pass a fresh
        optimizer), the learning rate a study's lr_scaling asks for, and the device-side NaN
        guard (a metric, ``first_nonfinite_step``: -1 while every output is finite). Under
        mixed_float16 Keras wraps the optimizer in a LossScaleOptimizer. Returns ``model``."""
        self.used.add("compile")
        own = {k: kwargs.pop(k) for k in ("jit_compile", "steps_per_execution") if k in kwargs}
        optimizer = keras.optimizers.get(optimizer)
        if K.accumulation(optimizer) > 1:
            own["accumulation_steps"] = K.accumulation(optimizer)
        settings = {**own, **{k: self.knobs[k] for k in K.COMPILE_KNOBS if k in self.explicit}}
        if self.trial is not None:
            policy = model.dtype_policy.name
            self._describe("settings", {**{k: v for k, v in own.items() if _knob_value(k, v)},
                                        **({"mixed_precision": policy} if policy in K.POLICIES[1:] else {})})
        optimizer = K.prepare_optimizer(optimizer, settings.get("accumulation_steps"), self.lr_scale)
        guard = FirstNonFinite() if self.guarded else None
        arguments = {**kwargs, **{k: settings[k] for k in ("jit_compile", "steps_per_execution") if k in settings}}
        model.compile(optimizer=optimizer, loss=loss, metrics=with_guard(metrics, guard) if guard else metrics,
                      **arguments)
        self.compiled[id(model)] = Compiled(model, loss, optimizer, guard)
        wanted = self.knobs["mixed_precision"]
        if "mixed_precision" in self.explicit and model.dtype_policy.name != wanted and self.role == "production":
            log.warning(f"the model computes under the {model.dtype_policy.name} policy, not the loaded {wanted}: "
                        f"build it after Tuned.load(), which sets Keras' global dtype policy")
        return model

    def fit(self, model: keras.Model, dataset: tf.data.Dataset, epochs: int = 1, *,
            evaluate: Callable[[], float] | None = None, **kwargs: Any) -> Any:
        """Train ``model`` on ``dataset``. In a trial: the measured burst (warm-up, settle,
        windows over ``train_samples``, the repeated pipeline), whatever ``epochs`` says; the
        script's ``callbacks`` run, its validation does not (it is off the clock); every later
        call trains nothing more. ``evaluate()`` (optional) scores the model: time-to-accuracy
        studies call it between windows. In production: ``model.fit`` as asked, watched.
        Returns Keras' History."""
        self.used.add("fit")
        if not isinstance(dataset, tf.data.Dataset):
            raise WorkloadError(f"kt.fit(model, dataset): expected a tf.data.Dataset (build it with "
                                f"kt.dataset(...)), got {type(dataset).__name__}")
        if not getattr(model, "compiled", False) or getattr(model, "optimizer", None) is None:
            raise WorkloadError("kt.fit(model, ...): the model is not compiled: call kt.compile(model, "
                                "optimizer=..., loss=...) first")
        if self.role == "probe":
            self._probe(model, dataset)
        if self.role in TRIAL_ROLES:
            return self._burst(model, dataset, evaluate, kwargs)
        return self._watched(model, dataset, epochs, kwargs)

    def stats(self) -> dict[str, Any]:
        """Live figures: in production the watchdog's (last interval's and mean samples/s against
        the confirmed rate) and the knobs read back; in a trial the burst's measurement."""
        trial = self.trial
        if trial is not None and (trial.record or trial.timer):
            return (trial.record or trial.timer.record).measurement()  # type: ignore[union-attr]
        return {**self.watchdog.stats(), "knobs": self.knobs_effective()}

    # ----------------------------------------------------------------- internals

    def _describe(self, key: str, values: dict[str, Any]) -> None:
        """The probe's record of the script's own settings (the first value of each wins)."""
        if self.role == "probe" and self.trial is not None:
            found = self.trial.description.setdefault(key, {})
            for name, value in values.items():
                found.setdefault(name, value)

    def _records(self, files: list[str], train_size: int | None) -> int:
        """Records in a trial's training files: the probe counted the first pipeline's once for
        the study (the request's ``train_records``); else ``train_size``, else counted."""
        assert self.trial is not None
        counted = self.trial.request.train_records
        if counted and not self._records_taken:
            self._records_taken = True
            return int(counted)
        return int(train_size or count_records(files))

    def _made(self, dataset: Any) -> Made | None:
        return next((m for m in self.made if m.dataset is dataset), None)

    def _batch_size(self, dataset: tf.data.Dataset) -> int | None:
        made = self._made(dataset)
        if made is not None:
            return int(made.settings["batch_size"])
        size = pipeline_knobs(describe_pipeline(dataset)).get("batch_size")
        return int(size) if size else None

    def _probe(self, model: keras.Model, dataset: tf.data.Dataset) -> None:
        """The probe: describe the script's job from what it set up, then stop it."""
        assert self.trial is not None
        self.trial.started = True
        description = self.trial.description
        description.update(models=[model], dataset=dataset, made=self._made(dataset),
                           batch_size=self._batch_size(dataset))
        raise ScriptDone

    def _burst(self, model: keras.Model, dataset: tf.data.Dataset, evaluate: Callable[[], float] | None,
               kwargs: dict[str, Any]) -> Any:
        trial = self.trial
        assert trial is not None
        if trial.started:
            return self.history  # the burst ran in the first call; the script's other epochs are not trained
        trial.started = True
        trial.setup_seconds = time.perf_counter() - self.created
        self.fit_model, self.fit_data = model, dataset
        batch = self._batch_size(dataset)
        if batch is None:
            raise WorkloadError("kt.fit(model, dataset): cannot tell the dataset's batch size (no batch op in its "
                                "pipeline); build it with kt.dataset(...)")
        made = self._made(dataset)
        data = trial.data = dataset if made is not None else dataset.repeat()  # the burst runs across epochs
        ahead = read_ahead({**pipeline_knobs(describe_pipeline(data)), "batch_size": batch})
        schedule = trial.schedule = make_schedule(trial.request.burst, batch, K.accumulation(model.optimizer),
                                                  int(model.steps_per_execution), read_ahead=ahead)
        if self.role == "diagnose":
            self._diagnose(model, data, made, schedule)
        target = trial.request.target_accuracy
        if target is not None and evaluate is None:
            raise InvalidKnobs("time-to-accuracy needs an evaluation between windows: call "
                               "kt.fit(model, dataset, evaluate=fn), fn() returning the held-out accuracy")
        hooks = hooks_from(trial.request, evaluate or (lambda: 0.0))
        try:
            if self.knobs["loop"] == "custom" and not trial.script:
                record = self._custom(model, data, schedule, hooks)
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
            raise K.rejected(exc, self.knobs) from None
        finally:
            trial.burst_end = time.perf_counter()
        trial.record = record
        trial.completed = (record.steps_done >= schedule.total_steps or record.nan_step is not None
                           or bool(record.target_reached))
        if not trial.completed:
            trial.stopped_at = record.steps_done
        return self.history

    def _compiled(self, model: keras.Model, why: str) -> Compiled:
        entry = self.compiled.get(id(model))
        if entry is None:
            raise WorkloadError(f"{why} trains the model with knobtune's @tf.function step, which needs its loss and "
                                f"optimizer: compile it with kt.compile(model, optimizer=..., loss=...)")
        return entry

    def _custom(self, model: keras.Model, data: tf.data.Dataset, schedule: Schedule, hooks: Any) -> BurstRecord:
        """The burst under knobtune's own ``@tf.function`` loop (``loop='custom'``)."""
        entry = self._compiled(model, "loop='custom'")
        train = self.custom = CustomStep(model, entry.loss, entry.optimizer, bool(model.jit_compile),
                                         model.dtype_policy.name)
        return drive(schedule, train.executor(data, schedule.batch_size), train.checkpoint, hooks=hooks)

    def _diagnose(self, model: keras.Model, data: tf.data.Dataset, made: Made | None, schedule: Schedule) -> None:
        """The bottleneck diagnosis: the input ceiling (the pipeline alone, per variant) and the
        compute ceiling (the train step under @tf.function on one batch already on the device,
        with the trial's XLA, dtype policy and accumulation), each timed with the burst's own
        schedule; then the script is stopped (its evaluation is not needed)."""
        trial = self.trial
        assert trial is not None
        if made is None:
            raise WorkloadError("the diagnosis rebuilds the input pipeline with other settings: build it with "
                                "kt.dataset(...)")
        entry = self._compiled(model, "the diagnosis")
        variants = trial.request.input_variants or {"as configured": {}}
        inputs = {label: self._input_ceiling(made, overrides, schedule) for label, overrides in variants.items()}
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
        trial.diagnosis = {
            "outcome": "ok",
            "input_samples_per_second": max(inputs.values()),
            "input_variants": inputs,
            "compute_samples_per_second": float(record.measurement()["samples_per_second"]),
        }
        trial.completed = True
        trial.burst_end = time.perf_counter()
        raise ScriptDone

    def _input_ceiling(self, made: Made, overrides: dict[str, Any], schedule: Schedule) -> float:
        settings = {**made.settings, **{k: v for k, v in overrides.items() if k in K.PIPELINE_KNOBS}}
        ds = build_pipeline(made.files, made.parse_fn, made.augment_fn, settings, made.shuffle_buffer, made.seed,
                            repeat=True)
        assert self.trial is not None
        plain = make_schedule(self.trial.request.burst, schedule.batch_size, schedule.accumulation_steps,
                              schedule.execution_steps, read_ahead=read_ahead(settings))
        iterator = iter(ds)

        def load_only(first: int, count: int) -> int:
            for _ in range(count):
                next(iterator)
            return count * schedule.batch_size

        record = drive(plain, load_only, lambda: GuardReading(True, None, None))
        return float(record.measurement()["samples_per_second"])

    def _watched(self, model: keras.Model, dataset: tf.data.Dataset, epochs: int, kwargs: dict[str, Any]) -> Any:
        """Production: the script's ``model.fit``, with the watchdog's callback."""
        self.fit_model, self.fit_data = model, dataset
        callbacks = list(kwargs.pop("callbacks", None) or [])
        batch = self._batch_size(dataset)
        if batch:
            entry = self.compiled.get(id(model))
            callbacks.append(WatchdogCallback(self.watchdog, batch, entry.guard if entry else None))
        else:
            log.warning("kt.fit: cannot tell the dataset's batch size (no batch op in its pipeline): the watchdog "
                        "does not watch this fit")
        return model.fit(dataset, epochs=epochs, callbacks=callbacks, **kwargs)

    # ----------------------------------------------------------------- the trial's result

    def not_exercised(self) -> dict[str, str]:
        """Knob -> why it was not applied: the script never made the call that applies it, or
        trained on a dataset (model) that call did not build (compile)."""
        out = self.uncalled()
        if self.fit_data is not None and "dataset" in self.used and self._made(self.fit_data) is None:
            out.update({name: "the dataset given to kt.fit is not built by kt.dataset(...)"
                        for name in K.PIPELINE_KNOBS})
        if self.fit_model is not None and "compile" in self.used and id(self.fit_model) not in self.compiled:
            out.update({name: "the model given to kt.fit is not compiled by kt.compile(...)"
                        for name in K.COMPILE_KNOBS})
        if self.trial is None or self.trial.script:
            out["loop"] = LOOP_WHY
        return out

    def knobs_effective(self) -> dict[str, Any]:
        """Every knob as the framework objects report it (read back, not echoed from the request)."""
        data = self.trial.data if self.trial is not None and self.trial.data is not None else self.fit_data
        if data is None and self.made:
            data = self.made[-1].dataset
        pipeline = {**pipeline_knobs(describe_pipeline(data)), **options_knobs(data)} if data is not None else None
        model = self.fit_model or (list(self.compiled.values())[-1].model if self.compiled else None)
        trained = Trained(self.knobs, self.gpu, pipeline=pipeline, model=model, custom=self.custom is not None)
        return SPACE.read_back(trained, self.not_exercised())

    def result(self) -> dict[str, Any]:
        """The trial's result (what the child writes): measurements, knobs read back, accuracy,
        the outcome; or the diagnosis."""
        trial = self.result_check()
        if trial.diagnosis is not None:
            return trial.diagnosis
        schedule, model = trial.schedule, self.fit_model
        assert schedule is not None and model is not None and trial.data is not None
        made = self._made(self.fit_data)
        pipeline = describe_pipeline(trial.data)
        effective = self.knobs_effective()
        optimizer = self.custom.optimizer if self.custom is not None else model.optimizer
        result: dict[str, Any] = {
            **(trial.record.measurement() if trial.record is not None else {}),
            "knobs_effective": effective,
            "not_exercised": self.not_exercised(),
            "setup_seconds": trial.setup_seconds,
            "effective_batch_size": schedule.batch_size * schedule.accumulation_steps,
            "lr_scale": self.lr_scale if id(model) in self.compiled else 1.0,
            "pipeline": pipeline,
            "applied": {
                "device": "gpu" if self.gpu else "cpu",
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
            },
        }
        if self.custom is not None:
            result["amp_skipped_steps"] = int(self.custom.skipped.numpy())
        self.judge(result, "the script's training stopped after {done} of the burst's {total} micro-batches "
                           "(a callback set model.stop_training?); kt.fit trains the whole burst by itself")
        result["peak_memory_mb"] = K.peak_memory_mb(self.gpu)
        result["memory_limit_mb"] = K.memory_limit_mb(self.gpu)
        return result


def _knob_value(name: str, value: Any) -> bool:
    """Whether a script's own compile setting is a value the knob can take (the study's baseline)."""
    if name == "jit_compile":
        return isinstance(value, bool)
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def for_request(request: Request, role: str = "trial") -> Tuned:
    """The trial (or probe) a child runs: its knobs applied, seeded, and activated for ``Tuned.load()``."""
    trial = Trial(request)
    kt = Tuned(dict(request.knobs), role=role, trial=trial)
    keras.utils.set_random_seed(trial.request.seed)  # initial weights, dropout, augmentation: the same every trial
    activate(kt)
    return kt


__all__ = ["Tuned", "ConfigError", "for_request", "activate"]
