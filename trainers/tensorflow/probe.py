"""The probe: fingerprint, hardware and a description of the workload (prepares its data)."""
from __future__ import annotations

from typing import Any

from trainers.common.child import probe_handler
from trainers.tensorflow import env
from trainers.tensorflow.data import count_records
from trainers.tensorflow.workload import load


def describe(request: dict[str, Any]) -> dict[str, Any]:
    workload = load(request["workload"], request.get("workload_options"))
    records = count_records(workload.train_files)  # reads every file: a corrupt one is named here
    model = workload.build_model()
    inputs, _ = workload.eval_data
    return {
        "name": workload.name,
        "parameters": int(model.count_params()),
        "train_samples": records,
        "train_files": len(workload.train_files),
        "eval_samples": int(len(inputs)),
        "sample_shape": list(inputs.shape[1:]),
        "conv": any("conv" in type(layer).__name__.lower() for layer in model.layers),
        "batch_size": workload.batch_size,
    }


run = probe_handler(env.fingerprint, describe)
