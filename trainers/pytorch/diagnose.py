"""Bottleneck diagnosis: the input ceiling (the data pipeline alone, no model) and the compute
ceiling (the train step on one batch already on the device, no loader), each timed with the
burst's own schedule and window timer, for the built-in loop and a user's script alike (the
integration API runs both inside ``kt.batches``)."""
from __future__ import annotations

from dataclasses import replace

from knobtune.trainers.common.wire import Request, Result
from knobtune.trainers.pytorch import burst


def run(request: Request) -> Result:
    """The bottleneck diagnosis; of a data-parallel study, on one rank alone (its share of the cores)."""
    return burst.run(replace(request, solo=True) if request.nproc > 1 else request, role="diagnose")
