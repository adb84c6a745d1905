"""The training loops a TensorFlow trial measures and production watches: Keras ``model.fit``
(timed by a callback at execution boundaries, guarded by a device-side metric) and a custom
loop under ``@tf.function`` (timed by the shared driver), with the same schedule, window timer
and guard semantics as PyTorch; and the production watchdog's callback."""
from __future__ import annotations

from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

from knobtune.trainers.common.errors import InvalidKnobs, WorkloadError
from knobtune.trainers.common.production import Watchdog, log
from knobtune.trainers.common.protocol import GuardReading, Hooks, Schedule, WindowTimer
from knobtune.trainers.common.script import ScriptDone
from knobtune.trainers.tensorflow.knobs import inner

GUARD_METRIC = "first_nonfinite_step"


class FirstNonFinite(keras.metrics.Metric):
    """The first step whose outputs are not finite (-1 while all are), kept on the device:
    the fit loop's NaN guard, read with the other logs at window boundaries only."""

    def __init__(self, name: str = GUARD_METRIC) -> None:
        super().__init__(name=name)
        # Under MirroredStrategy every replica keeps the same values (the flag below is summed over
        # them), so the first replica's are the group's; a summed variable would start at 0, not -1,
        # on the other replicas.
        self.step = self.add_variable(shape=(), initializer="zeros", dtype="int64", name="step",
                                      aggregation="only_first_replica")
        self.first = self.add_variable(shape=(), initializer=keras.initializers.Constant(-1), dtype="int64",
                                       name="first", aggregation="only_first_replica")

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        outputs = [tf.reduce_all(tf.math.is_finite(tf.cast(p, tf.float32))) for p in tf.nest.flatten(y_pred)]
        bad = tf.logical_not(tf.reduce_all(tf.stack(outputs)))
        replicas = tf.distribute.get_replica_context()
        if replicas is not None and replicas.num_replicas_in_sync > 1:  # any replica's outputs: the group's step
            bad = replicas.all_reduce("sum", tf.cast(bad, tf.float32)) > 0
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


class StepGuard(FirstNonFinite):
    """The NaN guard over a step's outputs (``FirstNonFinite``, the fit loop's), plus the loss (the
    first output) summed since the last reading and the last one, all on the device: read only at
    window boundaries (``reading``). Unguarded (the guard's cost measured), only the loss is kept."""

    def __init__(self, guarded: bool = True) -> None:
        super().__init__(name="step_guard")
        self.guarded = guarded
        self.total = self.add_variable(shape=(), initializer="zeros", dtype="float32", name="total")
        self.last = self.add_variable(shape=(), initializer="zeros", dtype="float32", name="last")
        self._read_steps = 0

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        # Few ops a step (each costs a few microseconds on a CPU, a kernel launch on a GPU): the
        # loss's mean is not finite when any of its elements is not, so it is checked once.
        flat = tf.nest.flatten(y_pred)
        loss = tf.reduce_mean(tf.cast(flat[0], tf.float32))
        if self.guarded:
            finite = tf.math.is_finite(loss)
            for other in flat[1:]:
                finite = finite & tf.reduce_all(tf.math.is_finite(tf.cast(other, tf.float32)))
            self.first.assign(tf.where(finite | (self.first >= 0), self.first, self.step))
        self.step.assign_add(1)
        self.total.assign_add(loss)
        self.last.assign(loss)

    def reading(self) -> GuardReading:
        steps = int(self.step.numpy())  # synchronises
        mean = float(self.total.numpy()) / max(1, steps - self._read_steps)
        self._read_steps = steps
        self.total.assign(0.0)
        first = int(self.first.numpy())
        return GuardReading(first < 0 and bool(np.isfinite(mean)), first if first >= 0 else None, mean)


class Pending:
    """A leaf of a batch that the step pulls inside its traced function (steps_per_execution > 1):
    what ``kt.batches`` yields in its place. Handed to the step as it comes, it names the leaf;
    used in any other way, it says why it cannot be."""

    __slots__ = ("execution", "index")

    def __init__(self, execution: Execution, index: int) -> None:
        self.execution, self.index = execution, index

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        why = ("steps_per_execution > 1 runs several steps per call of the step, each pulling its batch inside "
               "the traced function, and the script's loop over kt.batches(...) uses the batch itself: hand each "
               "batch to the step untouched (loss = step(*batch))")
        if self.execution.iterator is None:  # the probe's dry run: what the loop does with a batch is known
            self.execution.refused = why
            raise ScriptDone
        raise InvalidKnobs(f"steps_per_execution={self.execution.count}: {why}")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # protocols probed with hasattr (nest, NumPy): not this
            raise AttributeError(name)
        self._refuse()

    __array__ = __bool__ = __len__ = __iter__ = __getitem__ = __int__ = __float__ = _refuse
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _refuse
    __matmul__ = __rmatmul__ = __neg__ = _refuse

    def __repr__(self) -> str:
        return f"<batch leaf {self.index}, pulled inside the step>"


tf.register_tensor_conversion_function(Pending, lambda value, *args, **kwargs: value._refuse())


class Execution:
    """One call of the step that runs up to ``count`` steps over ``iterator`` inside its traced
    function; ``done`` (a device tensor) the steps it ran, once it ran. Without an iterator it is
    the probe's dry run: the step is not run, and ``refused`` says why the loop cannot hand it
    placeholders (None: it can)."""

    def __init__(self, iterator: Any, count: int) -> None:
        self.iterator, self.count = iterator, count
        self.done: tf.Tensor | None = None
        self.refused: str | None = None

    def placeholders(self, spec: Any) -> Any:
        """The batch as the loop sees it: each leaf of ``spec`` (the data's element) a ``Pending``."""
        leaves = tf.nest.flatten(spec)
        return tf.nest.pack_sequence_as(spec, [Pending(self, i) for i in range(len(leaves))])


def positional(spec: Any) -> Any:
    """The call ``step(*element)`` as a layout (``StepFunction.run``): a tuple element's leaves
    as the positional arguments, any other element as the one argument."""
    if isinstance(spec, tuple):
        return (tuple(range(len(spec))), {})
    return ((0,), {})


class StepFunction:
    """A train step (a Python function returning its loss) under ``tf.function``: XLA when
    ``jit``, the NaN guard and fp16 loss-scale skips kept on the device (one small update per
    step, read at window boundaries), and its traces counted (each run of the Python body in a
    graph is a trace; one outside a graph is an eager call). Called with a batch it runs one step
    (the script's own loop); called with the ``Pending`` leaves of an ``Execution`` it runs up to
    that many steps in one traced call, pulling each batch inside (``steps_per_execution``).
    ``optimizers()``: the optimizers the step applies (their loss scale's skips are counted).
    ``rejected(exc)``: what a TensorFlow error on a call becomes (None: itself)."""

    def __init__(self, fn: Callable[..., Any], jit: bool | None, execution_steps: int = 1,
                 optimizers: Callable[[], list[Any]] = list, guarded: bool = True,
                 rejected: Callable[[tf.errors.OpError], Exception] | None = None) -> None:
        self.fn, self.execution_steps, self.optimizers, self.rejected = fn, execution_steps, optimizers, rejected
        self.guard = StepGuard(guarded)
        self.skipped = tf.Variable(tf.constant(0, tf.int64), trainable=False)
        self.traces = self.eager_calls = self.calls = 0
        self.most_per_call = 0  # the most steps one call ran (known without a sync only where it was asked)
        self.traced = tf.function(self._body, jit_compile=jit)
        self._execute = tf.function(self._steps)

    def _body(self, *args: Any, **kwargs: Any) -> Any:
        if tf.inside_function():
            self.traces += 1
        else:
            self.eager_calls += 1  # tf.config.run_functions_eagerly(True): no graph, no XLA
        scaled = [o for o in self.optimizers() if isinstance(o, keras.optimizers.LossScaleOptimizer)]
        before = [tf.identity(o.dynamic_scale) for o in scaled]
        out = self.fn(*args, **kwargs)
        if out is None or not tf.nest.flatten(out):
            raise WorkloadError("the step kt.step(fn) wraps returned nothing: return its loss (knobtune's NaN guard "
                                "and the trial's final_loss read it)")
        for optimizer, scale in zip(scaled, before):  # a halved scale: the step was skipped
            self.skipped.assign_add(tf.cast(optimizer.dynamic_scale < scale, tf.int64))
        self.guard.update_state(None, out)
        return out

    def _steps(self, iterator: Any, count: tf.Tensor, layout: Any, extra: tuple[Any, ...]) -> tf.Tensor:
        done = tf.constant(0, tf.int64)
        for _ in tf.range(count):
            element = iterator.get_next_as_optional()
            if not element.has_value():
                break
            flat, given = tf.nest.flatten(element.get_value()), iter(extra)
            args, kwargs = tf.nest.pack_sequence_as(layout, [flat[i] if i >= 0 else next(given)
                                                             for i in tf.nest.flatten(layout)])
            self.traced(*args, **kwargs)
            done += 1
        return done

    def _call(self, run: Callable[[], Any]) -> Any:
        self.calls += 1
        try:
            return run()
        except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as exc:
            if self.rejected is None:
                raise
            raise self.rejected(exc) from None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        flat = tf.nest.flatten((args, kwargs))
        pending = [leaf for leaf in flat if isinstance(leaf, Pending)]
        if not pending:
            self.most_per_call = max(self.most_per_call, 1)
            return self._call(lambda: self.traced(*args, **kwargs))
        execution = pending[0].execution
        if any(p.execution is not execution for p in pending) or execution.done is not None:
            raise WorkloadError("kt.step: call the step once per batch kt.batches(...) yields, with that batch")
        if execution.iterator is None:  # the probe's dry run: the loop hands the batch to the step untouched
            raise ScriptDone
        layout = tf.nest.pack_sequence_as((args, kwargs), [leaf.index if isinstance(leaf, Pending) else -1
                                                           for leaf in flat])
        extra = tuple(leaf for leaf in flat if not isinstance(leaf, Pending))
        execution.done = self.run(execution.iterator, execution.count, layout, extra)
        return self.guard.last.value  # the last step's loss, on the device

    def run(self, iterator: Any, count: int, layout: Any, extra: tuple[Any, ...] = ()) -> tf.Tensor:
        """Up to ``count`` steps over ``iterator`` in one traced call, each calling the step as
        ``layout`` says (``(args, kwargs)``: a leaf's index in the element, or -1 for the next of
        ``extra``); the steps it ran, on the device."""
        self.most_per_call = max(self.most_per_call, count)
        return self._call(lambda: self._execute(iterator, tf.constant(count, tf.int64), layout, extra))

    def reading(self) -> GuardReading:
        return self.guard.reading()

    @property
    def graph(self) -> bool:
        """Whether the step ran as a graph (traced), not eagerly."""
        return self.eager_calls == 0

    @property
    def jit_used(self) -> bool:
        """XLA, read back from the tf.function (and no eager call, where it does not apply)."""
        return bool(getattr(self.traced, "_jit_compile", False)) and self.graph

    @property
    def per_call(self) -> int:
        """Steps per host call, as run (before any call: as set)."""
        return self.most_per_call or self.execution_steps

    def report(self) -> dict[str, Any]:
        """What a trial's ``applied`` says of the step: its traces, calls and whether it was a graph."""
        return {"step_traces": self.traces, "step_calls": self.calls, "step_graph": self.graph,
                "step_eager_calls": self.eager_calls}


class CustomStep:
    """knobtune's own train step for its built-in workloads (``loop='custom'``): the model's loss
    and optimizer (a LossScaleOptimizer under mixed_float16) in a ``StepFunction``."""

    def __init__(self, model: keras.Model, loss: Any, optimizer: Any, jit: bool, policy: str) -> None:
        if policy == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        optimizer.build(model.trainable_variables)
        self.optimizer = optimizer
        loss_fn = keras.losses.get(loss) if isinstance(loss, str) else loss

        def one_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
                scaled_loss = optimizer.scale_loss(loss)
            grads = tape.gradient(scaled_loss, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)
            return loss

        self.function = StepFunction(one_step, jit, optimizers=lambda: [optimizer])
        self.step_fn = self.function.traced
        self.skipped = self.function.skipped
        self.checkpoint = self.function.reading

    def executor(self, dataset: tf.data.Dataset, batch_size: int) -> Callable[[int, int], int]:
        """``step(first, count)`` for ``protocol.drive``: ``count`` steps per host call, the
        batches pulled inside the function (the iterator is made at the first call, so the
        pipeline's start-up is timed as warm-up)."""
        state: dict[str, Any] = {"iterator": None}
        layout = positional(dataset.element_spec)

        def step(first: int, count: int) -> int:
            if state["iterator"] is None:
                state["iterator"] = iter(dataset)
            self.function.run(state["iterator"], count, layout)
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
