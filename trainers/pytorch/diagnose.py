"""Bottleneck diagnosis: the input ceiling (the data pipeline alone, no model) and the compute
ceiling (the train step on one batch already on the device, no loader), each timed with the
burst's own schedule and window timer, for the built-in loop and a user's script alike (the
integration API runs both inside ``kt.batches``)."""
from __future__ import annotations

from knobtune.trainers.common.wire import Request, Result
from knobtune.trainers.pytorch import burst


def run(request: Request) -> Result:
    return burst.run(request, role="diagnose")
