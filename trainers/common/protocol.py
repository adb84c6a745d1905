"""The measurement protocol, shared by every framework (see DESIGN.md, "Measurement protocol").

A burst trains on ``train_samples``. The micro-batches that cover the first ``warmup_samples``
are timed apart (``warmup_seconds``); the rest is cut into ``windows`` windows whose boundaries
fall on optimizer-step boundaries where the window is long enough. Each window is timed end to
end (input pipeline included); the device is synchronised and the NaN guard read only at window
boundaries. ``samples_per_second`` is the median window rate, ``samples_per_second_cv`` the
windows' coefficient of variation.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

from trainers.common.errors import InvalidKnobs


@dataclass(frozen=True)
class BurstSpec:
    """How one trial measures; the same for every trial of a study."""

    train_samples: int = 12000
    warmup_samples: int = 2000
    windows: int = 5
    seed: int = 0

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> "BurstSpec":
        return cls(**{k: int(v) for k, v in data.items() if k in cls.__dataclass_fields__})  # type: ignore[arg-type]


@dataclass(frozen=True)
class Schedule:
    """Micro-batch indices at which warm-up ends and each window ends (exclusive)."""

    batch_size: int
    accumulation_steps: int
    total_steps: int
    warmup_steps: int
    window_ends: tuple[int, ...]

    @property
    def boundaries(self) -> tuple[int, ...]:
        return (self.warmup_steps, *self.window_ends)


def make_schedule(spec: BurstSpec, batch_size: int, accumulation_steps: int = 1) -> Schedule:
    """Cut a burst into warm-up and windows, counted in micro-batches of ``batch_size``.

    Raises InvalidKnobs when the burst is too short to give every window one micro-batch.
    """
    if batch_size < 1 or accumulation_steps < 1:
        raise InvalidKnobs(
            f"batch_size and accumulation_steps must be >= 1, got {batch_size} and {accumulation_steps}"
        )
    k = accumulation_steps
    total = math.ceil(spec.train_samples / batch_size)
    warm = math.ceil(spec.warmup_samples / batch_size)
    warm = min(total, math.ceil(warm / k) * k)  # warm-up ends on an optimizer step
    per = (total - warm) // spec.windows
    if per >= k:
        per = per // k * k
    if per < 1:
        raise InvalidKnobs(
            f"burst too short: train_samples={spec.train_samples} minus warm-up leaves "
            f"{(total - warm) * batch_size} samples, fewer than windows={spec.windows} "
            f"micro-batches of batch_size={batch_size}"
        )
    ends = [warm + per * (i + 1) for i in range(spec.windows)]
    ends[-1] = total  # the remainder joins the last window
    return Schedule(batch_size, k, total, warm, tuple(ends))


@dataclass(frozen=True)
class GuardReading:
    """What a trainer reads off the device at a window boundary (one sync)."""

    finite: bool
    first_bad_step: int | None
    mean_loss: float | None


@dataclass
class BurstRecord:
    """Timings and guard state of one burst, turned into the result's measurement fields."""

    warmup_seconds: float = 0.0
    warmup_samples: int = 0
    windows: list[tuple[int, float]] = field(default_factory=list)  # (samples, seconds)
    steps_done: int = 0
    samples_done: int = 0
    nan_step: int | None = None
    final_loss: float | None = None

    def measurement(self) -> dict[str, object]:
        rates = [samples / seconds for samples, seconds in self.windows if seconds > 0]
        out: dict[str, object] = {
            "warmup_seconds": self.warmup_seconds,
            "warmup_samples_measured": self.warmup_samples,
            "window_samples": [s for s, _ in self.windows],
            "window_seconds": [t for _, t in self.windows],
            "window_rates": rates,
            "trained_samples": self.samples_done,
            "steps": self.steps_done,
            "final_loss": self.final_loss,
            "burst_seconds": self.warmup_seconds + sum(t for _, t in self.windows),
        }
        if rates:
            out["samples_per_second"] = statistics.median(rates)
            mean = statistics.fmean(rates)
            out["samples_per_second_cv"] = statistics.pstdev(rates) / mean if len(rates) > 1 else 0.0
        if self.nan_step is not None:
            out["nan_step"] = self.nan_step
        return out


def drive(
    schedule: Schedule,
    step: Callable[[int], int],
    checkpoint: Callable[[], GuardReading],
    clock: Callable[[], float] = time.perf_counter,
) -> BurstRecord:
    """Run micro-batches 0..total-1 through ``step`` and time them by the schedule.

    ``step(i)`` trains on micro-batch i and returns its sample count without synchronising;
    ``checkpoint()`` synchronises the device and reads the NaN guard. It is called only at
    boundaries. A non-finite loss stops the burst at the next boundary.
    """
    record = BurstRecord()
    boundaries = schedule.boundaries
    b = 0
    # A boundary at step 0 (no warm-up) is passed with nothing measured.
    while b < len(boundaries) and boundaries[b] == 0:
        b += 1
    start = clock()
    segment_samples = 0
    for i in range(schedule.total_steps):
        segment_samples += step(i)
        record.steps_done = i + 1
        if b < len(boundaries) and i + 1 == boundaries[b]:
            reading = checkpoint()
            now = clock()
            if b == 0 and schedule.warmup_steps > 0:
                record.warmup_seconds = now - start
                record.warmup_samples = segment_samples
            else:
                record.windows.append((segment_samples, now - start))
            record.samples_done += segment_samples
            record.final_loss = reading.mean_loss
            segment_samples = 0
            start = clock()
            b += 1
            if not reading.finite:
                record.nan_step = reading.first_bad_step if reading.first_bad_step is not None else i
                break
    return record
