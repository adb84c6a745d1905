"""Bottleneck diagnosis: the input ceiling (the tf.data pipeline alone, no model) and the compute
ceiling (the train step on one batch already on the device, no pipeline), each timed with the
burst's own schedule and window timer, for the built-in loop and a user's script alike (the
integration API runs both inside ``kt.fit``; a script needs kt.dataset and kt.compile). The
compute ceiling runs the @tf.function step (the fit loop's own step is Keras-internal) with the
trial's XLA, dtype policy and accumulation."""
from __future__ import annotations

from knobtune.trainers.common.wire import Request, Result
from knobtune.trainers.tensorflow import burst


def run(request: Request) -> Result:
    return burst.run(request, role="diagnose")
