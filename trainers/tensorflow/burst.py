"""One TensorFlow trial's child: the built-in training loop over a ``Workload``, or the user's own
script, both through the integration API (trainers/tensorflow/tuned.py), which applies the knobs,
times the burst and guards it.

The built-in loop trains with Keras ``model.fit`` or, with ``loop = "custom"``, knobtune's own
``@tf.function`` loop (the seeds show both); both use the same schedule, window timer and guard
semantics as PyTorch.
"""
from __future__ import annotations

import keras
import numpy as np

from knobtune.trainers.common.tuned import run_request
from knobtune.trainers.common.wire import Request, Result
from knobtune.trainers.tensorflow.faults import oom_reason
from knobtune.trainers.tensorflow.tuned import Tuned, for_request
from knobtune.trainers.tensorflow.workload import Workload, load


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


def train(workload: Workload) -> None:
    """The built-in training loop: a user of the integration API like any script."""
    kt = Tuned.load()
    ds = kt.dataset(workload.train_files, workload.parse_fn, workload.augment_fn, batch_size=workload.batch_size,
                    shuffle_buffer=workload.shuffle_buffer, train_size=workload.train_size)
    model = workload.build_model()
    kt.compile(model, optimizer=workload.build_optimizer(), loss=workload.loss)
    eval_batch = int(workload.eval_batch_size or kt.knobs["batch_size"] or workload.batch_size)

    def score() -> float:
        return evaluate(workload, model, eval_batch)

    kt.fit(model, ds, evaluate=score)
    kt.report(val_accuracy=score(), eval_batch_size=eval_batch)


def run(request: Request, role: str = "trial") -> Result:
    """The request's result: the built-in loop over its workload, or its ``script`` run with
    ``args`` (trainers.common.tuned.run_request); an out-of-memory failure is outcome oom."""
    return run_request(request, role, for_request,
                       lambda r: train(load(r.workload, r.workload_options)),
                       lambda exc, kt: oom_reason(exc))
