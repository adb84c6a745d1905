"""The integration API for TensorFlow (Keras 3): the few calls a training script makes so that
knobtune can tune it (inside a trial) and run the winner (in production) through the same lines::

    kt = Tuned.load()                     # first: threads and the dtype policy apply to what is built after
    ds = kt.dataset(files, parse_fn, augment_fn, batch_size=64)   # interleave, parallel maps, cache, prefetch
    model = build_model()
    kt.compile(model, optimizer=keras.optimizers.Adam(1e-3), loss=loss, metrics=["accuracy"])
    kt.fit(model, ds, epochs=10)          # XLA, steps_per_execution, accumulation, the NaN guard
    kt.report(val_accuracy=evaluate(model))

or, for a script with its own ``@tf.function`` step and loop::

    optimizer = kt.optimizer(model, keras.optimizers.Adam(1e-3))   # accumulation; loss scaling under fp16
    @kt.step                              # in place of @tf.function: XLA, steps per call, the NaN guard
    def train_step(x, y): ...             # a GradientTape step that returns its loss
    for x, y in kt.batches(ds):           # the measured burst in a trial; one pass, watched, in production
        loss = train_step(x, y)

``Tuned.load()`` must come before the script builds its model: it sets the Keras global dtype
policy (``mixed_precision``), which a layer takes when it is built, and TensorFlow's intra-op
threads, which are fixed once its runtime starts. In a data-parallel trial or export (``[study]
nproc`` > 1) it also sets a ``MirroredStrategy`` over the replicas' devices as the process's
strategy (``kt.strategy``; trainers/tensorflow/distributed.py): the model built afterwards is
mirrored, ``kt.dataset`` batches ``batch_size`` per replica (the global batch is that times the
replicas), and ``kt.fit`` trains every replica.

Roles: inside a trial's child (``trial``, ``diagnose``) the knobs are the trial's and
``kt.fit`` runs the measured burst (``train_samples`` over the repeated pipeline, whatever
``epochs`` says; every later call trains nothing more); in the probe it stops the script at its
first ``kt.fit``; in production the knobs come from an export (``$KNOBTUNE_CONFIG`` or a path)
and ``kt.fit`` is the script's ``model.fit`` with a watchdog callback that compares the live
rate with the confirmed one; with neither, the script's own arguments apply. Each role is a
driver (trainers/tensorflow/roles.py), chosen once when the ``Tuned`` is made. The built-in
workloads train through this same API (trainers/tensorflow/burst.py).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import keras
import tensorflow as tf

from knobtune.trainers.common.errors import WorkloadError
from knobtune.trainers.common.production import ConfigError, WatchdogSettings, ensure_logging, log
from knobtune.trainers.common.tuned import Trial, TunedBase, export_knobs
from knobtune.trainers.common.wire import Request
from knobtune.trainers.tensorflow import env
from knobtune.trainers.tensorflow import knobs as K
from knobtune.trainers.tensorflow.data import AUTOTUNE, build_pipeline, describe_pipeline, options_knobs, pipeline_knobs
from knobtune.trainers.tensorflow.loops import CustomStep, FirstNonFinite, StepFunction, with_guard
from knobtune.trainers.tensorflow.roles import DRIVERS, Driver

LOOP_WHY = ("the script trains through kt.fit (Keras model.fit); loop='custom' is knobtune's own @tf.function "
            "loop for its built-in workloads")
STEP_LOOP_WHY = ("the script trains with its own step (kt.step); loop='custom' is knobtune's own @tf.function loop "
                 "for its built-in workloads")
STEP_KNOBS = ("jit_compile", "steps_per_execution")  # what kt.step applies (kt.optimizer: accumulation_steps)
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
    settings: dict[str, Any]  # every pipeline knob, batch_size (per replica) included
    shuffle_buffer: int
    seed: int | None
    repeat: bool
    records: int | None
    replicas: int = 1  # each batch of the pipeline is batch_size x replicas (the global batch)

    @property
    def batch(self) -> int:
        """The pipeline's batch: every replica's together."""
        return int(self.settings["batch_size"]) * self.replicas


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
    START_HINT = "does it call kt.fit(model, dataset)? (with its own step: does it loop over kt.batches(dataset)?)"
    DRIVERS = DRIVERS
    driver: Driver

    def __init__(self, knobs: dict[str, Any], *, role: str, explicit: set[str] | None = None,
                 trial: Trial | None = None, config: dict[str, Any] | None = None,
                 settings: WatchdogSettings | None = None) -> None:
        self.knobs = {**K.DEFAULTS, "batch_size": None, **knobs}
        self.explicit = set(knobs) if explicit is None else explicit
        self.config = config
        self._choose(role, trial, config, settings)
        # before env.hardware() lists the devices (which reads the environment)
        late = K.HANDLERS.apply(self.knobs, self.explicit, K.Trained(self.knobs), environ=True)
        self.hardware = env.hardware()
        self.gpu = bool(self.hardware["gpu"])
        self.replicas = _replicas(role, trial, config, self.hardware)
        self.created = time.perf_counter()
        self.driver.check()
        first = {"gpu_thread_mode"} & self.explicit  # before anything could start TensorFlow's runtime
        trained = K.Trained(self.knobs, self.gpu, replicas=self.replicas)
        # (cross_device_ops, declared last, starts a data-parallel process's strategy: after the thread knobs,
        # before the script builds its model; with its default when the knob was not given)
        unapplied = {**K.HANDLERS.apply(self.knobs, first, trained),
                     **K.HANDLERS.apply(self.knobs, self.explicit - first | {"cross_device_ops"}, trained)}
        if not self.gpu:  # on a GPU the late flag only keeps XLA from clustering the ops left on the CPU
            unapplied.update(late)
        for why in unapplied.values():
            self.driver.refuse(why)
        self.strategy: tf.distribute.Strategy | None = tf.distribute.get_strategy() if self.replicas > 1 else None
        self.used: set[str] = set()
        self.made: list[Made] = []
        self.compiled: dict[int, Compiled] = {}  # id(model) ->
        self.fit_model: keras.Model | None = None
        self.fit_data: tf.data.Dataset | None = None
        self.custom: CustomStep | None = None  # the custom loop's step, when the burst ran one
        self.prepared: list[tuple[keras.Model, keras.optimizers.Optimizer]] = []  # kt.optimizer's
        self.step_function: StepFunction | None = None  # the script's own step (kt.step)
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
        chosen, config, knobs = loaded
        measured = int((config.get("group") or {}).get("nproc") or 1)
        replicas = _replicas("production", None, config, hardware)
        if replicas != measured:
            how = f"as {measured} MirroredStrategy replicas" if measured > 1 else "on one device"
            log.warning(f"{chosen} was measured {how}; this job has {replicas} "
                        f"{'replicas (one per visible GPU)' if replicas > 1 else 'device'}: the per-replica "
                        f"settings apply, but its speed may not hold")
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
        epoch is one pass over the files. Under MirroredStrategy (``kt.strategy``) each batch is
        ``batch_size`` x the replicas, which ``model.fit`` splits between them. ``train_size``: the
        records in ``files``, when known (else a trial counts them). Build the training data with
        it (the first call in a trial is taken to be the training data the probe counted)."""
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
        buffer, seed, repeat, records = self.driver.pipeline(names, own, settings, train_size, shuffle, shuffle_buffer)
        batch = int(settings["batch_size"]) * self.replicas  # (Made.batch)
        ds = build_pipeline(names, parse_fn, augment_fn, {**settings, "batch_size": batch}, buffer, seed,
                            repeat=repeat, drop_remainder=repeat)
        self.made.append(Made(ds, names, parse_fn, augment_fn, settings, buffer, seed, repeat, records, self.replicas))
        return ds

    def compile(self, model: keras.Model, optimizer: Any = "rmsprop", loss: Any = None, metrics: Any = None,
                **kwargs: Any) -> keras.Model:
        """``model.compile`` with the knobs' ``jit_compile`` (XLA), ``steps_per_execution`` and
        ``accumulation_steps`` (the optimizer's gradient_accumulation_steps; pass a fresh
        optimizer), the learning rate a study's lr_scaling asks for, and the device-side NaN
        guard (a metric, ``first_nonfinite_step``: -1 while every output is finite). Under
        mixed_float16 Keras wraps the optimizer in a LossScaleOptimizer. Returns ``model``."""
        self.used.add("compile")
        self._mirrored(model, "kt.compile")
        own = {k: kwargs.pop(k) for k in ("jit_compile", "steps_per_execution") if k in kwargs}
        optimizer = keras.optimizers.get(optimizer)
        if K.accumulation(optimizer) > 1:
            own["accumulation_steps"] = K.accumulation(optimizer)
        settings = {**own, **{k: self.knobs[k] for k in K.COMPILE_KNOBS if k in self.explicit}}
        optimizer = K.prepare_optimizer(optimizer, settings.get("accumulation_steps"), self.lr_scale)
        guard = FirstNonFinite() if self.guarded else None
        arguments = {**kwargs, **{k: settings[k] for k in ("jit_compile", "steps_per_execution") if k in settings}}
        model.compile(optimizer=optimizer, loss=loss, metrics=with_guard(metrics, guard) if guard else metrics,
                      **arguments)
        self.compiled[id(model)] = Compiled(model, loss, optimizer, guard)
        self.driver.compiled(model, own)
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
        self._mirrored(model, "kt.fit")
        return self.driver.fit(model, dataset, epochs, evaluate, kwargs)

    def optimizer(self, model: keras.Model, optimizer: Any) -> keras.optimizers.Optimizer:
        """The optimizer a script's own step (``kt.step``) applies, prepared for ``model`` as
        ``kt.compile`` prepares fit's: ``accumulation_steps`` (its gradient_accumulation_steps;
        pass a fresh optimizer), the learning rate a study's lr_scaling asks for, and under
        mixed_float16 a ``LossScaleOptimizer`` around it (scale the loss with
        ``optimizer.scale_loss(loss)``, which leaves it as it is otherwise); built on the model's
        weights. Use the returned optimizer in the step."""
        self.used.add("optimizer")
        optimizer = keras.optimizers.get(optimizer)
        own = {"accumulation_steps": K.accumulation(optimizer)} if K.accumulation(optimizer) > 1 else {}
        wanted = self.knobs["accumulation_steps"] if "accumulation_steps" in self.explicit else None
        optimizer = K.prepare_optimizer(optimizer, wanted, self.lr_scale)
        if model.dtype_policy.name == "mixed_float16" and not isinstance(optimizer,
                                                                        keras.optimizers.LossScaleOptimizer):
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        optimizer.build(model.trainable_variables)  # its variables exist before the step is traced (XLA)
        self.prepared.append((model, optimizer))
        self.driver.compiled(model, own)
        return optimizer

    def step(self, fn: Callable[..., Any] | None = None, *, jit_compile: bool | None = None,
             steps_per_execution: int | None = None) -> Any:
        """``fn`` (a train step returning its loss; a ``tf.function`` is unwrapped) under
        ``tf.function`` with the knobs' ``jit_compile`` (XLA) and the device-side NaN guard; a
        decorator (``@kt.step``) or a call. With ``steps_per_execution`` N > 1 the batches
        ``kt.batches`` yields stand for N batches that the step pulls inside one traced call (a
        ``tf.range`` loop over the iterator); hand each to the step untouched, and the call returns
        the last step's loss. The script's own ``jit_compile`` (or its ``tf.function``'s) and
        ``steps_per_execution`` apply where no knob is set. Its traces are counted: a trial reports
        them (``applied``: ``step_traces``, ``step_calls``, ``step_graph``), and one whose step is
        traced again on every call of its measured windows is invalid."""
        if fn is None:
            return lambda f: self.step(f, jit_compile=jit_compile, steps_per_execution=steps_per_execution)
        self.used.add("step")
        if self.strategy is not None:
            raise WorkloadError(f"kt.step: a data-parallel run ({self.replicas} MirroredStrategy replicas) trains "
                                f"through kt.fit; a script's own step is not run on several replicas yet: tune it "
                                f"with nproc = 1")
        if self.step_function is not None:
            raise WorkloadError("kt.step(fn): a script has one step; this one already wraps "
                                f"{getattr(self.step_function.fn, '__name__', 'a step')}")
        own: dict[str, Any] = {}
        inner = getattr(fn, "python_function", None)  # a tf.function: its Python function, and its own XLA setting
        if inner is not None:
            if jit_compile is None and getattr(fn, "_jit_compile", None) is not None:
                jit_compile = bool(fn._jit_compile)
            fn = inner
        if not callable(fn):
            raise WorkloadError(f"kt.step(fn): expected the train step (a function), got {type(fn).__name__}")
        if jit_compile is not None:
            own["jit_compile"] = bool(jit_compile)
        if steps_per_execution is not None:
            own["steps_per_execution"] = int(steps_per_execution)
        settings = {**own, **{k: self.knobs[k] for k in STEP_KNOBS if k in self.explicit}}
        jit = settings.get("jit_compile")
        rejected = (lambda exc: K.rejected(exc, self.knobs, ("jit_compile", "mixed_precision", "steps_per_execution"))
                    ) if self.trial is not None else None
        self.step_function = StepFunction(fn, None if jit == "auto" else jit,
                                          int(settings.get("steps_per_execution") or 1),
                                          optimizers=lambda: [o for _, o in self.prepared], guarded=self.guarded,
                                          rejected=rejected)
        self.driver.compiled(None, own)
        return self.step_function

    def batches(self, dataset: tf.data.Dataset, evaluate: Callable[[], float] | None = None) -> Iterator[Any]:
        """The batches of ``dataset`` for the script's loop around its ``kt.step``: in a trial the
        measured burst (warm-up, settle, windows over ``train_samples``, the repeated pipeline,
        whatever the script's epochs; every later call yields nothing); in production one pass,
        watched. With ``steps_per_execution`` N > 1 each item stands for N batches (see
        ``kt.step``). ``evaluate()`` (optional) scores the model: time-to-accuracy studies call
        it between windows."""
        self.used.add("batches")
        if not isinstance(dataset, tf.data.Dataset):
            raise WorkloadError(f"kt.batches(dataset): expected a tf.data.Dataset (build it with kt.dataset(...)), "
                                f"got {type(dataset).__name__}")
        if self.step_function is None:
            raise WorkloadError("kt.batches(dataset) drives the script's step: wrap it with kt.step(train_step) "
                                "(in place of @tf.function) before the loop")
        scaled = any(isinstance(o, keras.optimizers.LossScaleOptimizer) for _, o in self.prepared)
        if keras.mixed_precision.global_policy().name == "mixed_float16" and not scaled:
            self.driver.refuse("mixed_precision='mixed_float16' computes in float16 and needs loss scaling: prepare "
                               "the step's optimizer with kt.optimizer(model, optimizer) and scale the loss with "
                               "optimizer.scale_loss(loss)")
        return self.driver.batches(dataset, evaluate)

    # ----------------------------------------------------------------- shared by the drivers

    def _mirrored(self, model: keras.Model, call: str) -> None:
        """Under MirroredStrategy, WorkloadError when ``model``'s variables were made outside it
        (built before ``Tuned.load()``: Keras' fit would fail with a bare AssertionError)."""
        if self.strategy is None:
            return
        plain = [w.path for w in model.weights
                 if not isinstance(getattr(w, "value", w), tf.distribute.DistributedValues)]
        if plain:
            raise WorkloadError(f"{call}: the model's variables ({plain[0]}{', ...' if len(plain) > 1 else ''}) were "
                                f"made outside the {self.replicas}-replica MirroredStrategy: build the model after "
                                f"Tuned.load(), which sets the strategy")

    def _made(self, dataset: Any) -> Made | None:
        return next((m for m in self.made if m.dataset is dataset), None)

    def _batch_size(self, dataset: tf.data.Dataset, per_replica: bool = False) -> int | None:
        """The samples of one batch of ``dataset``: every replica's (what a step trains), or one's."""
        made = self._made(dataset)
        if made is not None:
            size: int | None = made.batch
        else:
            size = pipeline_knobs(describe_pipeline(dataset)).get("batch_size")
        if not size:
            return None
        return int(size) // self.replicas if per_replica else int(size)

    # ----------------------------------------------------------------- what the trial applied

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
        if "step" in self.used:  # kt.step applies jit_compile and steps_per_execution, kt.optimizer accumulation
            for name in STEP_KNOBS:
                out.pop(name, None)
            if self.prepared:
                out.pop("accumulation_steps", None)
            elif "compile" not in self.used:
                out["accumulation_steps"] = "the step's optimizer is not prepared by kt.optimizer(model, optimizer)"
        if self.trial is None or self.trial.script:
            out["loop"] = STEP_LOOP_WHY if "step" in self.used else LOOP_WHY
        if self.strategy is None:
            out["cross_device_ops"] = "one replica: no MirroredStrategy sums gradients across devices"
        return out

    def trained_with(self) -> tuple[keras.Model | None, Any]:
        """The model and optimizer the burst trained: kt.fit's (or knobtune's custom loop's), else
        the script's own step's (kt.optimizer's), else the last compiled."""
        if self.fit_model is not None:
            model = self.fit_model
            return model, self.custom.optimizer if self.custom is not None else getattr(model, "optimizer", None)
        if self.prepared:
            return self.prepared[-1]
        if self.compiled:
            model = list(self.compiled.values())[-1].model
            return model, model.optimizer
        return None, None

    def knobs_effective(self) -> dict[str, Any]:
        """Every knob as the framework objects report it (read back, not echoed from the request)."""
        data = self.trial.data if self.trial is not None and self.trial.data is not None else self.fit_data
        if data is None and self.made:
            data = self.made[-1].dataset
        pipeline = {**pipeline_knobs(describe_pipeline(data)), **options_knobs(data)} if data is not None else None
        if pipeline is not None and pipeline.get("batch_size"):  # the strategy splits each batch between the replicas
            pipeline["batch_size"] = int(pipeline["batch_size"]) // self.replicas
        model, optimizer = self.trained_with()
        step = self.step_function
        trained = K.Trained(self.knobs, self.gpu, pipeline=pipeline, model=model, custom=self.custom is not None,
                            step=step, optimizer=optimizer if step is not None else None, strategy=self.strategy)
        return K.HANDLERS.read_back(trained, self.not_exercised())


def _replicas(role: str, trial: Trial | None, config: dict[str, Any] | None, hardware: dict[str, Any]) -> int:
    """The replicas this process trains: a trial's group (one alone for the scaling figure's
    ``solo`` run and for the diagnosis); in production of a data-parallel export, one per
    visible GPU (on a machine without one, the measured count of logical CPU devices)."""
    if trial is not None:
        request = trial.request
        return 1 if request.solo or role == "diagnose" else max(1, int(request.nproc))
    measured = int(((config or {}).get("group") or {}).get("nproc") or 1)
    if measured <= 1:
        return 1
    return int(hardware.get("gpu_count") or 0) or measured


def for_request(request: Request, role: str = "trial") -> Tuned:
    """The trial (or probe, or diagnosis) a child runs: its knobs applied, seeded, and activated for
    ``Tuned.load()``."""
    trial = Trial(request)
    kt = Tuned(dict(request.knobs), role=role, trial=trial)
    keras.utils.set_random_seed(trial.request.seed)  # initial weights, dropout, augmentation: the same every trial
    activate(kt)
    return kt


__all__ = ["Tuned", "ConfigError", "for_request", "activate"]
