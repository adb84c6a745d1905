"""One TensorFlow trial: apply every knob for real, run the measured burst, evaluate, guard.

Two training loops, as the seeds show both: Keras ``model.fit`` (timed by a callback at
execution boundaries) and a custom loop under ``@tf.function`` (timed by the shared driver).
Both use the same schedule, the same window timer and the same guard semantics as PyTorch.
"""
from __future__ import annotations

import resource
import time
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from trainers.common.errors import InvalidKnobs
from trainers.common.protocol import (BurstRecord, BurstSpec, GuardReading, Hooks, Schedule, WindowTimer, drive,
                                      hooks_from, make_schedule)
from trainers.tensorflow.data import build_pipeline, count_records, describe_pipeline, pipeline_knobs, read_ahead
from trainers.tensorflow.faults import oom_reason
from trainers.tensorflow.workload import Workload, load

POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")
LOOPS = ("fit", "custom")


class FirstNonFinite(keras.metrics.Metric):
    """The first step whose outputs are not finite (-1 while all are), kept on the device:
    the fit loop's NaN guard, read with the other logs at window boundaries only."""

    def __init__(self, name: str = "first_nonfinite_step") -> None:
        super().__init__(name=name)
        self.step = self.add_variable(shape=(), initializer="zeros", dtype="int64", name="step")
        self.first = self.add_variable(shape=(), initializer=keras.initializers.Constant(-1), dtype="int64",
                                       name="first")

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        bad = tf.logical_not(tf.reduce_all(tf.math.is_finite(tf.cast(y_pred, tf.float32))))
        self.first.assign(tf.where(bad & (self.first < 0), self.step, self.first))
        self.step.assign_add(1)

    def result(self) -> Any:
        return self.first

    def reset_state(self) -> None:
        self.step.assign(0)
        self.first.assign(-1)


class _FitTimer(keras.callbacks.Callback):
    """Feeds Keras' execution boundaries to the shared WindowTimer."""

    def __init__(self, schedule: Schedule, hooks: Hooks | None = None) -> None:
        super().__init__()
        self.schedule = schedule
        self.timer = WindowTimer(schedule, hooks=hooks)
        self._steps = 0
        self._loss_mark = (0, 0.0)  # (steps, running mean) at the last boundary

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.timer.start()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        steps = batch + 1
        samples = (steps - self._steps) * self.schedule.batch_size
        self._steps = steps
        if not self.timer.passed(steps, samples, lambda: self._reading(steps, logs or {})):
            self.model.stop_training = True

    def _reading(self, steps: int, logs: dict) -> GuardReading:
        # Keras' logs are already host values here (it converts them after every execution).
        mean, first = float(logs.get("loss", float("nan"))), int(logs.get("first_nonfinite_step", -1))
        prev_steps, prev_mean = self._loss_mark
        window_mean = (mean * steps - prev_mean * prev_steps) / max(1, steps - prev_steps)
        self._loss_mark = (steps, mean)
        finite = first < 0 and bool(np.isfinite(mean))
        return GuardReading(finite, first if first >= 0 else None, window_mean)


def _check(knobs: dict[str, Any], gpu: bool) -> None:
    if knobs["mixed_precision"] not in POLICIES:
        raise InvalidKnobs(f"mixed_precision={knobs['mixed_precision']!r}: expected one of {', '.join(POLICIES)}")
    if knobs["mixed_precision"] == "mixed_float16" and not gpu:
        raise InvalidKnobs("mixed_precision='mixed_float16' (with loss scaling) needs a GPU; this child has none")
    if knobs["loop"] not in LOOPS:
        raise InvalidKnobs(f"loop={knobs['loop']!r}: expected 'fit' or 'custom'")


def _optimizer_accumulation(optimizer: keras.optimizers.Optimizer) -> int:
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    return int(inner.gradient_accumulation_steps or 1)


class CustomStep:
    """One train step under ``@tf.function`` (XLA when ``jit``), with the NaN guard and fp16
    loss-scale skips kept in ``tf.Variable``s: read only at window boundaries."""

    def __init__(self, model: keras.Model, workload: Workload, optimizer: Any, jit: bool, policy: str) -> None:
        self.scaled = policy == "mixed_float16"
        if self.scaled:
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        optimizer.build(model.trainable_variables)
        self.optimizer = optimizer
        loss_fn = keras.losses.get(workload.loss) if isinstance(workload.loss, str) else workload.loss
        self.bad = tf.Variable(False)
        self.first_bad = tf.Variable(tf.constant(-1, tf.int64))
        self.counter = tf.Variable(tf.constant(0, tf.int64))
        self.loss_sum = tf.Variable(0.0)
        self.skipped = tf.Variable(tf.constant(0, tf.int64))
        self._read_steps = 0

        def one_step(x: tf.Tensor, y: tf.Tensor) -> None:
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
                scaled_loss = optimizer.scale_loss(loss)
            grads = tape.gradient(scaled_loss, model.trainable_variables)
            if self.scaled:
                before = tf.identity(optimizer.dynamic_scale)
            optimizer.apply(grads, model.trainable_variables)
            if self.scaled:
                self.skipped.assign_add(tf.cast(optimizer.dynamic_scale < before, tf.int64))
            value = tf.cast(loss, tf.float32)
            bad_now = tf.logical_not(tf.math.is_finite(value))
            self.first_bad.assign(tf.where(bad_now & (self.first_bad < 0), self.counter, self.first_bad))
            self.bad.assign(tf.logical_or(self.bad, bad_now))
            self.counter.assign_add(1)
            self.loss_sum.assign_add(value)

        self.step_fn = tf.function(one_step, jit_compile=jit, reduce_retracing=True)

    def checkpoint(self) -> GuardReading:
        steps = int(self.counter.numpy())  # synchronises
        mean = float(self.loss_sum.numpy()) / max(1, steps - self._read_steps)
        self._read_steps = steps
        self.loss_sum.assign(0.0)
        first = int(self.first_bad.numpy())
        return GuardReading(not bool(self.bad.numpy()), first if first >= 0 else None, mean)


class Trainer:
    """Every knob applied to one workload: threads, dtype policy, the tf.data pipeline, model and
    optimizer. The burst, time-to-accuracy evaluations and the diagnosis ceilings share it."""

    def __init__(self, request: dict[str, Any]) -> None:
        knobs = self.knobs = dict(request["knobs"])
        self.spec = BurstSpec.from_dict(request["burst"])
        self.threads = int(knobs.get("intra_op_threads", 0))
        if self.threads > 0:
            tf.config.threading.set_intra_op_parallelism_threads(self.threads)  # before the runtime starts
        self.gpu = bool(tf.config.list_physical_devices("GPU"))
        _check(knobs, self.gpu)
        k, spe = int(knobs["accumulation_steps"]), int(knobs["steps_per_execution"])
        self.schedule = make_schedule(self.spec, int(knobs["batch_size"]), k, spe, read_ahead=read_ahead(knobs))
        self.policy, self.jit, self.loop = knobs["mixed_precision"], bool(knobs["jit_compile"]), knobs["loop"]
        if self.gpu and "tf32" in knobs:  # TensorFlow's default on Ampere and newer: TF32 on
            tf.config.experimental.enable_tensor_float_32_execution(bool(knobs["tf32"]))
        keras.mixed_precision.set_global_policy(self.policy)
        keras.utils.set_random_seed(self.spec.seed)
        setup_start = time.perf_counter()
        self.workload = workload = load(request["workload"], request.get("workload_options"))
        # the probe counted the records once for the study; only a child run by hand counts here
        records = request.get("train_records") or workload.train_size or count_records(workload.train_files)
        if records < self.schedule.batch_size:
            raise InvalidKnobs(f"batch_size={self.schedule.batch_size} is larger than the training set "
                               f"({records} samples)")
        self.shuffle_buffer = min(records, workload.shuffle_buffer)
        self.ds = build_pipeline(workload.train_files, workload.parse_fn, workload.augment_fn, knobs,
                                 self.shuffle_buffer, self.spec.seed)
        self.model = workload.build_model()
        self.optimizer = workload.build_optimizer(**({"gradient_accumulation_steps": k} if k > 1 else {}))
        self.lr_scale = float(request.get("lr_scale", 1.0))
        if self.lr_scale != 1.0:  # lr_scaling: the workload's learning rate, rescaled with the effective batch
            self.optimizer.learning_rate = float(self.optimizer.learning_rate) * self.lr_scale
        self.setup_seconds = time.perf_counter() - setup_start

    def eval_batch_size(self) -> int:
        return int(self.workload.eval_batch_size or self.schedule.batch_size)

    def evaluate(self) -> float:
        return evaluate(self.workload, self.model, self.eval_batch_size())

    def fit(self, hooks: Hooks | None) -> tuple[BurstRecord, dict[str, Any]]:
        model, schedule = self.model, self.schedule
        model.compile(optimizer=self.optimizer, loss=self.workload.loss, metrics=[FirstNonFinite()],
                      jit_compile=self.jit, steps_per_execution=schedule.execution_steps)
        timer = _FitTimer(schedule, hooks)
        model.fit(self.ds, epochs=1, steps_per_epoch=schedule.total_steps, verbose=0, callbacks=[timer],
                  shuffle=False)
        return timer.timer.record, {
            "jit_compile": bool(model.jit_compile),
            "steps_per_execution": int(model.steps_per_execution),
            "loss_scale_optimizer": isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer),
            "accumulation_steps": _optimizer_accumulation(model.optimizer),
            "amp_skipped_steps": None,
        }

    def custom(self, hooks: Hooks | None) -> tuple[BurstRecord, dict[str, Any]]:
        schedule = self.schedule
        train = CustomStep(self.model, self.workload, self.optimizer, self.jit, self.policy)

        @tf.function
        def execute(iterator: Any, count: tf.Tensor) -> None:
            for _ in tf.range(count):  # steps_per_execution steps per host call
                x, y = next(iterator)
                train.step_fn(x, y)

        state: dict[str, Any] = {"iterator": None}

        def step(first: int, count: int) -> int:
            if state["iterator"] is None:  # made here, so pipeline start-up is timed as warm-up
                state["iterator"] = iter(self.ds)
            execute(state["iterator"], tf.constant(count, tf.int64))
            return count * schedule.batch_size

        record = drive(schedule, step, train.checkpoint, hooks=hooks)
        return record, {
            "jit_compile": self.jit,
            "steps_per_execution": schedule.execution_steps,
            "loss_scale_optimizer": train.scaled,
            "accumulation_steps": _optimizer_accumulation(train.optimizer),
            "amp_skipped_steps": int(train.skipped.numpy()),
        }


def evaluate(workload: Workload, model: keras.Model, batch_size: int) -> float:
    """Score the held-out split with the trained weights: a float32 twin, no augmentation, in
    batches of ``batch_size``."""
    policy = keras.mixed_precision.global_policy().name
    keras.mixed_precision.set_global_policy("float32")
    try:
        twin = workload.build_model()
    finally:
        keras.mixed_precision.set_global_policy(policy)
    twin.set_weights(model.get_weights())
    inputs, targets = workload.eval_data
    outputs = np.concatenate([np.asarray(twin(inputs[i:i + batch_size], training=False))
                              for i in range(0, len(inputs), batch_size)])
    return float(workload.metric(outputs, np.asarray(targets)))


def peak_memory_mb(gpu: bool) -> float:
    if gpu:
        return tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def _rejected(exc: tf.errors.OpError, knobs: dict[str, Any]) -> InvalidKnobs:
    chosen = ", ".join(f"{k}={knobs[k]!r}" for k in ("jit_compile", "mixed_precision", "steps_per_execution", "loop"))
    return InvalidKnobs(f"TensorFlow rejected this combination ({chosen}): {exc.message.splitlines()[0]}")


def run(request: dict[str, Any]) -> dict[str, Any]:
    """The burst request's result: measurements, knobs read back, accuracy, or an oom outcome.
    Building the trainer, training and evaluation all run inside the out-of-memory handling."""
    try:
        t = Trainer(request)
        return _measure(t, request)
    except Exception as exc:
        reason = oom_reason(exc)
        if reason is None:
            raise
        return {"outcome": "oom", "failure": reason}


def _measure(t: Trainer, request: dict[str, Any]) -> dict[str, Any]:
    knobs, schedule, loop, gpu, threads, k = t.knobs, t.schedule, t.loop, t.gpu, t.threads, t.schedule.accumulation_steps
    pipeline = describe_pipeline(t.ds)
    hooks = hooks_from(request, t.evaluate)
    try:
        record, applied = t.fit(hooks) if loop == "fit" else t.custom(hooks)
    except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as exc:
        raise _rejected(exc, knobs) from None
    policy_used = t.model.dtype_policy.name
    tf32 = gpu and bool(tf.config.experimental.tensor_float_32_execution_enabled())  # no TF32 on a CPU

    result: dict[str, Any] = {
        **record.measurement(),
        "knobs_effective": {
            **pipeline_knobs(pipeline),
            "accumulation_steps": applied["accumulation_steps"],
            "jit_compile": applied["jit_compile"],
            "mixed_precision": policy_used,
            "steps_per_execution": applied["steps_per_execution"],
            "loop": loop,
            "intra_op_threads": threads and tf.config.threading.get_intra_op_parallelism_threads(),
            "tf32": tf32,
        },
        "setup_seconds": t.setup_seconds,
        "effective_batch_size": schedule.batch_size * k,
        "lr_scale": t.lr_scale,
        "pipeline": pipeline,
        "applied": {
            "device": "gpu" if gpu else "cpu",
            "policy": policy_used,
            "loss_scale_optimizer": applied["loss_scale_optimizer"],
            "jit_compile": applied["jit_compile"],
            "steps_per_execution": applied["steps_per_execution"],
            "accumulation_steps": applied["accumulation_steps"],
            "loop": loop,
            "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
            "learning_rate": float(t.optimizer.learning_rate),
            "tf32": tf32,
            "shuffle_buffer": t.shuffle_buffer,
            "read_ahead_batches": read_ahead(knobs),
            "eval_batch_size": t.eval_batch_size(),
        },
    }
    if applied["amp_skipped_steps"] is not None:
        result["amp_skipped_steps"] = applied["amp_skipped_steps"]
    if record.nan_step is not None:
        result.update(outcome="nan",
                      failure=f"loss became non-finite at step {record.nan_step} of {schedule.total_steps}")
    else:
        eval_start = time.perf_counter()
        result["val_accuracy"] = t.evaluate()
        result["eval_seconds"] = time.perf_counter() - eval_start
        result["outcome"] = "ok"
    result["peak_memory_mb"] = peak_memory_mb(gpu)
    return result
