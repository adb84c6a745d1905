"""Bottleneck diagnosis: the input ceiling (the data pipeline alone, no model) and the compute
ceiling (the train step on one batch already on the device, no loader), each timed with the
burst's own schedule and window timer."""
from __future__ import annotations

from typing import Any

from trainers.common.protocol import GuardReading, drive
from trainers.pytorch.burst import Trainer


def _input_ceiling(request: dict[str, Any]) -> float:
    t = Trainer(request)

    def load_only(i: int, count: int = 1) -> int:
        _, targets = t.next_batch()
        return len(targets)

    def sync() -> GuardReading:
        t.sync()
        return GuardReading(True, None, None)

    record = drive(t.schedule, load_only, sync, drained=t.drained)
    t.close()
    return float(record.measurement()["samples_per_second"])


def run(request: dict[str, Any]) -> dict[str, Any]:
    inputs = {}
    for label, loader_knobs in request.get("input_variants", {"as configured": {}}).items():
        inputs[label] = _input_ceiling({**request, "knobs": {**request["knobs"], **loader_knobs}})
    t = Trainer(request)
    batch_inputs, batch_targets = t.next_batch()
    t.close()
    t.model.train()
    record = drive(t.schedule, lambda i, count=1: t.train_on(batch_inputs, batch_targets, i), t.checkpoint)
    return {
        "outcome": "ok",
        "input_samples_per_second": max(inputs.values()),
        "input_variants": inputs,
        "compute_samples_per_second": float(record.measurement()["samples_per_second"]),
    }
