"""A data-parallel trial measured as one job (framework-free): each rank's request, and the ranks'
results merged into the trial's.

Each rank trains ``1/nproc`` of the burst's samples (the group trains ``train_samples`` in all, as
a one-process trial does), on the same schedule: the ranks' segment boundaries fall on the same
steps and meet in a collective there (the guard read from every rank), so window ``i`` of every
rank covers the same steps. The group's window ``i`` is their samples together over the slowest
rank's seconds; ``samples_per_second`` is the median of those, as for one process. Rank 0
evaluates: the accuracy is its.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import replace
from typing import Any

from knobtune.trainers.common.protocol import BurstRecord
from knobtune.trainers.common.wire import Burst, Request, Result


def rank_request(request: Request, rank: int) -> Request:
    """What rank ``rank`` of ``request``'s group runs: its share of the burst, as one process (its
    group is torchrun's environment); only rank 0 writes progress lines and must report an accuracy."""
    n = request.nproc
    burst = request.burst
    share = Burst(train_samples=math.ceil(burst.train_samples / n), warmup_samples=math.ceil(burst.warmup_samples / n),
                  windows=burst.windows, min_window_seconds=burst.min_window_seconds)
    first = rank == 0
    return replace(request, burst=share, progress_path=request.progress_path if first else None,
                   accuracy_required=request.accuracy_required and first, nproc=1, solo=False)


def first_failure(results: dict[int, Result]) -> tuple[int, Result] | None:
    """The rank whose outcome the group's is: a non-finite loss first (every rank sees it, through
    the guard's collective), then out of memory, then an invalid run."""
    for outcome in ("nan", "oom", "invalid"):
        for rank, result in sorted(results.items()):
            if result.outcome == outcome:
                return rank, result
    return None


def merge(results: dict[int, Result], nproc: int, backend: str, shares: list[tuple[int, ...]]) -> Result:
    """The group's result from every rank's (rank -> result, all present)."""
    first = results[0]
    rates = {rank: r.samples_per_second for rank, r in sorted(results.items())}
    group: dict[str, Any] = {
        "nproc": nproc, "backend": backend,
        "ranks": [{"rank": rank, "samples_per_second": rates[rank], "cores": list(shares[rank]),
                   "outcome": r.outcome, "placement": r.placement} for rank, r in sorted(results.items())],
    }
    failed = first_failure(results)
    if failed is not None:
        rank, result = failed
        return replace(result, failure=f"rank {rank} of {nproc}: {result.failure}", group=group)
    known = {rank: rate for rank, rate in rates.items() if rate is not None}
    if known:
        slowest = min(known, key=lambda rank: known[rank])
        group.update(slowest_rank=slowest, rank_spread=max(known.values()) / known[slowest] - 1.0)
    windows = [r.window_samples or [] for r in results.values()]
    seconds = [r.window_seconds or [] for r in results.values()]
    count = min(len(w) for w in windows)
    record = BurstRecord(
        warmup_seconds=max(r.warmup_seconds or 0.0 for r in results.values()),
        warmup_samples=sum(r.warmup_samples_measured or 0 for r in results.values()),
        settle_seconds=max(r.settle_seconds or 0.0 for r in results.values()),
        settle_samples=sum(r.settle_samples or 0 for r in results.values()),
        settle_drained=first.settle_drained, min_window_seconds=0.0,
        windows=[(sum(w[i] for w in windows), max(s[i] for s in seconds)) for i in range(count)],
        steps_done=first.steps or 0, samples_done=sum(r.trained_samples or 0 for r in results.values()),
        final_loss=statistics.fmean(r.final_loss for r in results.values() if r.final_loss is not None)
        if any(r.final_loss is not None for r in results.values()) else None)
    measured = record.measurement()
    measured.pop("steps", None)
    for key in ("short_windows", "unsettled"):  # (rank 0's, in the group's train_samples)
        advice = getattr(first, key)
        if advice is not None:
            measured[key] = {**advice, "suggested_train_samples": advice["suggested_train_samples"] * nproc}
    peaks = [r.peak_memory_mb for r in results.values() if r.peak_memory_mb is not None]
    return replace(first, **measured, group=group,
                   effective_batch_size=(first.effective_batch_size or 0) * nproc or None,
                   peak_memory_mb=max(peaks) if peaks else None,
                   amp_skipped_steps=max((r.amp_skipped_steps or 0) for r in results.values()),
                   setup_seconds=max(r.setup_seconds or 0.0 for r in results.values()))
