"""The training loops a TensorFlow trial measures and production watches: Keras ``model.fit``
(timed by a callback at execution boundaries, guarded by a device-side metric) and a custom
loop under ``@tf.function`` (timed by the shared driver), with the same schedule, window timer
and guard semantics as PyTorch; and the production watchdog's callback."""
from __future__ import annotations

from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

from knobtune.trainers.common.production import Watchdog, log
from knobtune.trainers.common.protocol import GuardReading, Hooks, Schedule, WindowTimer
from knobtune.trainers.tensorflow.knobs import inner

GUARD_METRIC = "first_nonfinite_step"


class FirstNonFinite(keras.metrics.Metric):
    """The first step whose outputs are not finite (-1 while all are), kept on the device:
    the fit loop's NaN guard, read with the other logs at window boundaries only."""

    def __init__(self, name: str = GUARD_METRIC) -> None:
        super().__init__(name=name)
        self.step = self.add_variable(shape=(), initializer="zeros", dtype="int64", name="step")
        self.first = self.add_variable(shape=(), initializer=keras.initializers.Constant(-1), dtype="int64",
                                       name="first")

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        outputs = [tf.reduce_all(tf.math.is_finite(tf.cast(p, tf.float32))) for p in tf.nest.flatten(y_pred)]
        bad = tf.logical_not(tf.reduce_all(tf.stack(outputs)))
        self.first.assign(tf.where(bad & (self.first < 0), self.step, self.first))
        self.step.assign_add(1)

    def result(self) -> Any:
        return self.first

    def reset_state(self) -> None:
        self.step.assign(0)
        self.first.assign(-1)


def with_guard(metrics: Any, guard: FirstNonFinite) -> Any:
    """The script's ``metrics`` for ``model.compile`` plus the NaN guard (on the first output)."""
    if isinstance(metrics, dict):
        if not metrics:
            return [guard]
        first = next(iter(metrics))
        return {**metrics, first: with_guard(metrics[first], guard)}
    listed = [] if metrics is None else list(metrics) if isinstance(metrics, (list, tuple)) else [metrics]
    return [m for m in listed if not isinstance(m, FirstNonFinite)] + [guard]


class FitTimer(keras.callbacks.Callback):
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
        mean, first = float(logs.get("loss", float("nan"))), int(logs.get(GUARD_METRIC, -1))
        prev_steps, prev_mean = self._loss_mark
        window_mean = (mean * steps - prev_mean * prev_steps) / max(1, steps - prev_steps)
        self._loss_mark = (steps, mean)
        finite = first < 0 and bool(np.isfinite(mean))
        return GuardReading(finite, first if first >= 0 else None, window_mean)


class CustomStep:
    """One train step under ``@tf.function`` (XLA when ``jit``), with the NaN guard and fp16
    loss-scale skips kept in ``tf.Variable``s: read only at window boundaries."""

    def __init__(self, model: keras.Model, loss: Any, optimizer: Any, jit: bool, policy: str) -> None:
        self.scaled = policy == "mixed_float16"
        if self.scaled:
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        optimizer.build(model.trainable_variables)
        self.optimizer = optimizer
        loss_fn = keras.losses.get(loss) if isinstance(loss, str) else loss
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

    def executor(self, dataset: tf.data.Dataset, batch_size: int) -> Callable[[int, int], int]:
        """``step(first, count)`` for ``protocol.drive``: ``count`` steps per host call, the
        batches pulled inside the function (the iterator is made at the first call, so the
        pipeline's start-up is timed as warm-up)."""
        train = self.step_fn

        @tf.function
        def execute(iterator: Any, count: tf.Tensor) -> None:
            for _ in tf.range(count):  # steps_per_execution steps per host call
                x, y = next(iterator)
                train(x, y)

        state: dict[str, Any] = {"iterator": None}

        def step(first: int, count: int) -> int:
            if state["iterator"] is None:
                state["iterator"] = iter(dataset)
            execute(state["iterator"], tf.constant(count, tf.int64))
            return count * batch_size

        return step


class WatchdogCallback(keras.callbacks.Callback):
    """Production's ``model.fit`` watched. An execution's samples are counted when the next one
    begins (``on_train_batch_begin`` gets no logs, so Keras keeps dispatching its batch-end work
    asynchronously: nothing here syncs per step), the epoch's last one when the epoch ends.
    The watchdog syncs at its own interval by reading the NaN guard's variable (else the
    optimizer's step counter)."""

    def __init__(self, watchdog: Watchdog, batch_size: int, guard: FirstNonFinite | None) -> None:
        super().__init__()
        self.watchdog, self.batch_size, self.guard = watchdog, batch_size, guard
        self._begun: int | None = None  # the step the running execution began at
        watchdog.sync = self._sync

    def _sync(self) -> None:
        if self.guard is not None:
            if int(self.guard.first.numpy()) >= 0:
                log.warning("the model's outputs became non-finite during the last watchdog interval")
        else:
            inner(self.model.optimizer).iterations.numpy()

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.watchdog.resume()

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._begun = None

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if self._begun is not None and batch > self._begun:
            self.watchdog.step((batch - self._begun) * self.batch_size)
        self._begun = batch

    def _last_execution(self) -> None:
        """The epoch's last execution. When the pipeline's length is unknown, Keras begins one
        execution more than there are batches and stops at the missing data: that one trained
        nothing. (There, with steps_per_execution > 1, a short last execution counts whole.)"""
        steps = self.params.get("steps") if self.params else None
        if self._begun is not None and steps:
            execution = int(getattr(self.model, "steps_per_execution", 1) or 1)
            self.watchdog.step(max(0, min(execution, steps - self._begun)) * self.batch_size)
        self._begun = None

    def on_test_begin(self, logs: dict | None = None) -> None:
        self._last_execution()
        self.watchdog.pause()  # validation is not training

    def on_test_end(self, logs: dict | None = None) -> None:
        self.watchdog.resume()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self._last_execution()

    def on_train_end(self, logs: dict | None = None) -> None:
        self.watchdog.pause()
