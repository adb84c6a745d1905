"""Bottleneck diagnosis: the input ceiling (the tf.data pipeline alone, no model) and the compute
ceiling (the train step on one batch already on the device, no pipeline), each timed with the
burst's own schedule and window timer. The compute ceiling runs the @tf.function step (the fit
loop's own step is Keras-internal) with the trial's XLA, dtype policy and accumulation."""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from trainers.common.protocol import GuardReading, drive
from trainers.tensorflow.burst import CustomStep, Trainer


def _input_ceiling(request: dict[str, Any]) -> float:
    t = Trainer(request)
    iterator = iter(t.ds)

    def load_only(first: int, count: int) -> int:
        for _ in range(count):
            next(iterator)
        return count * t.schedule.batch_size

    record = drive(t.schedule, load_only, lambda: GuardReading(True, None, None))
    return float(record.measurement()["samples_per_second"])


def run(request: dict[str, Any]) -> dict[str, Any]:
    inputs = {}
    for label, pipeline_knobs in request.get("input_variants", {"as configured": {}}).items():
        inputs[label] = _input_ceiling({**request, "knobs": {**request["knobs"], **pipeline_knobs}})
    t = Trainer(request)
    x, y = next(iter(t.ds))
    train = CustomStep(t.model, t.workload, t.optimizer, t.jit, t.policy)

    @tf.function
    def repeat(count: tf.Tensor) -> None:
        for _ in tf.range(count):
            train.step_fn(x, y)

    def step(first: int, count: int) -> int:
        repeat(tf.constant(count, tf.int64))
        return count * t.schedule.batch_size

    record = drive(t.schedule, step, train.checkpoint)
    return {
        "outcome": "ok",
        "input_samples_per_second": max(inputs.values()),
        "input_variants": inputs,
        "compute_samples_per_second": float(record.measurement()["samples_per_second"]),
    }
