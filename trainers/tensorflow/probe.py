"""The probe: fingerprint, hardware and a description of the workload (prepares its data), or
of the user's script (run until its first ``kt.fit``)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import keras
import numpy as np

from knobtune.trainers.common import script
from knobtune.trainers.common.child import probe_handler
from knobtune.trainers.common.wire import Request
from knobtune.trainers.tensorflow import env
from knobtune.trainers.tensorflow.data import count_records
from knobtune.trainers.tensorflow.tuned import for_request
from knobtune.trainers.tensorflow.workload import load


def _conv(model: keras.Model) -> bool:
    return any("conv" in type(layer).__name__.lower() for layer in model.layers)


def _parameters(model: keras.Model) -> int:
    """Trainable parameters, as PyTorch's twin counts them (BatchNorm's moving statistics are
    buffers there, not parameters)."""
    try:
        return sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    except ValueError:  # a subclassed model that was never built
        return 0


def describe_script(request: Request) -> dict[str, Any]:
    """Run the script until its first ``kt.fit`` or ``kt.batches``: what it builds, and its own settings (the
    batch size and pipeline settings it gives kt.dataset, the jit_compile, steps_per_execution
    and accumulation it gives kt.compile: the baseline's values)."""
    kt = for_request(replace(request, knobs={}), role="probe")
    script.run(request.script, list(request.args))
    kt.result_check()
    seen = kt.driver.description  # type: ignore[attr-defined]
    models = seen.get("models") or []
    made = seen.get("made")
    spec = seen["dataset"].element_spec
    first = next(script.leaves(spec), None)
    shape = getattr(first, "shape", None)
    return {
        "name": Path(request.script).name,
        "parameters": sum(_parameters(m) for m in models),
        "train_samples": made.records if made is not None else None,
        "train_files": len(made.files) if made is not None else None,
        "eval_samples": None,
        "sample_shape": list(shape[1:]) if shape is not None and shape.rank else None,
        "conv": any(_conv(m) for m in models),
        "batch_size": seen.get("batch_size"),
        "settings": dict(seen.get("settings") or {}),
        "calls": sorted(kt.used),
        **kt.driver.step_batches(),  # type: ignore[attr-defined]
    }


def _group(request: Request) -> dict[str, Any]:
    """For a data-parallel study: what MirroredStrategy over ``nproc`` replicas can use here (tried
    on a tiny model before anything else is built: trainers/tensorflow/distributed.py)."""
    if request.nproc <= 1:
        return {}
    from knobtune.trainers.tensorflow import distributed

    return {"distributed": {"nproc": request.nproc, **distributed.capabilities(request.nproc)}}


def describe(request: Request) -> dict[str, Any]:
    group = _group(request)
    if request.script:
        return {**group, **describe_script(request)}
    workload = load(request.workload, request.workload_options)
    records = count_records(workload.train_files)  # reads every file: a corrupt one is named here
    model = workload.build_model()
    inputs, _ = workload.eval_data
    return {
        **group,
        "name": workload.name,
        "parameters": _parameters(model),
        "train_samples": records,
        "train_files": len(workload.train_files),
        "eval_samples": int(len(inputs)),
        "sample_shape": list(inputs.shape[1:]),
        "conv": _conv(model),
        "batch_size": workload.batch_size,
    }


run = probe_handler(env.fingerprint, describe)
