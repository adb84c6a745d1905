"""The measurement protocol, shared by every framework (see DESIGN.md, "Measurement protocol").

A burst trains on ``train_samples``. The micro-batches that cover the first ``warmup_samples``
are timed apart (``warmup_seconds``); the rest is cut into ``windows`` windows whose boundaries
fall on optimizer-step boundaries where the window is long enough. Each window is timed end to
end (input pipeline included); the device is synchronised and the NaN guard read only at window
boundaries. ``samples_per_second`` is the median window rate, ``samples_per_second_cv`` the
windows' coefficient of variation.
"""
from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

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
    """Micro-batch indices at which warm-up ends and each window ends (exclusive).

    ``execution_steps`` micro-batches run per host call (Keras ``steps_per_execution``); every
    boundary falls on an execution boundary, so a window is never cut inside a device call.
    """

    batch_size: int
    accumulation_steps: int
    total_steps: int
    warmup_steps: int
    window_ends: tuple[int, ...]
    execution_steps: int = 1

    @property
    def boundaries(self) -> tuple[int, ...]:
        return (self.warmup_steps, *self.window_ends)


def make_schedule(spec: BurstSpec, batch_size: int, accumulation_steps: int = 1,
                  execution_steps: int = 1) -> Schedule:
    """Cut a burst into warm-up and windows, counted in micro-batches of ``batch_size``.

    (In time-to-accuracy mode the engine asks for one window per evaluation interval.)

    Warm-up ends on an optimizer step and an execution boundary; windows are whole executions,
    and whole optimizer steps when they are long enough. Raises InvalidKnobs when the burst is
    too short to give every window at least one execution.
    """
    for name, value in (("batch_size", batch_size), ("accumulation_steps", accumulation_steps),
                        ("steps_per_execution", execution_steps)):
        if value < 1:
            raise InvalidKnobs(f"{name} must be >= 1, got {value}")
    k, e = accumulation_steps, execution_steps
    step_align = math.lcm(k, e)
    total = math.ceil(spec.train_samples / batch_size)
    total = math.ceil(total / e) * e  # the last execution is a whole one
    warm = math.ceil(spec.warmup_samples / batch_size)
    warm = min(total, math.ceil(warm / step_align) * step_align)
    per = (total - warm) // spec.windows
    per = per // step_align * step_align if per >= step_align else per // e * e
    if per < 1:
        raise InvalidKnobs(
            f"burst too short: train_samples={spec.train_samples} minus warm-up leaves "
            f"{(total - warm) * batch_size} samples, fewer than windows={spec.windows} "
            f"executions of {e} micro-batch(es) of batch_size={batch_size}"
        )
    ends = [warm + per * (i + 1) for i in range(spec.windows)]
    ends[-1] = total  # the remainder joins the last window
    return Schedule(batch_size, k, total, warm, tuple(ends), e)


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
    evaluations: list[dict[str, float]] = field(default_factory=list)  # time-to-accuracy checkpoints
    target_reached: bool | None = None

    def training_seconds(self) -> float:
        return self.warmup_seconds + sum(t for _, t in self.windows)

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
        if self.target_reached is not None:
            out["evaluations"] = self.evaluations
            out["target_reached"] = self.target_reached
            if self.target_reached:
                out["time_to_accuracy"] = self.evaluations[-1]["training_seconds"]
        return out


@dataclass
class Hooks:
    """Optional work at window boundaries, outside the timed windows.

    ``progress(segment)`` sees each stamped segment (the parent's pruning reads these);
    ``evaluate()`` scores the held-out split after each window, and the burst stops once it
    reaches ``target`` (time-to-accuracy mode).
    """

    progress: Callable[[dict[str, Any]], None] | None = None
    evaluate: Callable[[], float] | None = None
    target: float | None = None


def progress_writer(path: str | None) -> Callable[[dict[str, Any]], None] | None:
    """Append each segment as a JSON line to ``path`` (read by the parent while the child runs)."""
    if not path:
        return None

    def write(segment: dict[str, Any]) -> None:
        with open(path, "a") as f:
            f.write(json.dumps(segment) + "\n")

    return write


def hooks_from(request: dict[str, Any], evaluate: Callable[[], float]) -> Hooks:
    """The hooks a burst request asks for: progress lines, and evaluation toward a target."""
    target = request.get("target_accuracy")
    return Hooks(progress=progress_writer(request.get("progress_path")),
                 evaluate=evaluate if target is not None else None, target=target)


class WindowTimer:
    """Stamps the schedule's boundaries: the one timing mechanism every training loop uses.

    Call ``start()`` right before the first micro-batch is requested (so worker start-up and
    compilation land in warm-up), then ``passed(steps_done, samples, reading)`` after each
    execution; it records a segment when ``steps_done`` is a boundary and returns False when the
    burst must stop (a non-finite loss).
    """

    def __init__(self, schedule: Schedule, clock: Callable[[], float] = time.perf_counter,
                 hooks: Hooks | None = None) -> None:
        self.schedule, self.clock = schedule, clock
        self.hooks = hooks or Hooks()
        self.record = BurstRecord()
        if self.hooks.evaluate is not None:
            self.record.target_reached = False
        self._next = 0
        self._skip_empty()
        self._segment_samples = 0
        self._t0 = 0.0

    def _skip_empty(self) -> None:
        # A boundary at step 0 (no warm-up) closes nothing.
        while self._next < len(self.schedule.boundaries) and self.schedule.boundaries[self._next] == 0:
            self._next += 1

    def start(self) -> None:
        self._t0 = self.clock()

    def due(self, steps_done: int) -> bool:
        return self._next < len(self.schedule.boundaries) and steps_done == self.schedule.boundaries[self._next]

    def passed(self, steps_done: int, samples: int, reading: Callable[[], GuardReading]) -> bool:
        """Count ``samples`` trained up to ``steps_done``; at a boundary, read the guard and stamp."""
        self._segment_samples += samples
        self.record.steps_done = steps_done
        if not self.due(steps_done):
            return True
        guard = reading()  # synchronises the device
        now = self.clock()
        warmup = self._next == 0 and self.schedule.warmup_steps > 0
        seconds = now - self._t0
        if warmup:
            self.record.warmup_seconds = seconds
            self.record.warmup_samples = self._segment_samples
        else:
            self.record.windows.append((self._segment_samples, seconds))
        self.record.samples_done += self._segment_samples
        self.record.final_loss = guard.mean_loss
        self._next += 1
        go_on = guard.finite
        if not guard.finite:
            self.record.nan_step = guard.first_bad_step if guard.first_bad_step is not None else steps_done - 1
        if self.hooks.progress:
            self.hooks.progress({"warmup": warmup, "samples": self._segment_samples, "seconds": seconds,
                                 "rate": self._segment_samples / seconds if seconds > 0 else None,
                                 "steps": steps_done})
        if go_on and not warmup and self.hooks.evaluate is not None:
            accuracy = float(self.hooks.evaluate())
            self.record.evaluations.append({"samples": self.record.samples_done, "accuracy": accuracy,
                                            "training_seconds": self.record.training_seconds()})
            if self.hooks.target is not None and accuracy >= self.hooks.target:
                self.record.target_reached = True
                go_on = False
        self._segment_samples = 0
        self._t0 = self.clock()  # evaluation and progress stay outside the timed windows
        return go_on


def drive(
    schedule: Schedule,
    step: Callable[[int, int], int],
    checkpoint: Callable[[], GuardReading],
    clock: Callable[[], float] = time.perf_counter,
    hooks: Hooks | None = None,
) -> BurstRecord:
    """Run the burst as executions of ``schedule.execution_steps`` micro-batches and time it.

    ``step(first, count)`` trains on micro-batches first..first+count-1 and returns their sample
    count without synchronising; ``checkpoint()`` synchronises and reads the NaN guard, and is
    called only at boundaries. A non-finite loss stops the burst at the next boundary.
    """
    timer = WindowTimer(schedule, clock, hooks)
    e = schedule.execution_steps
    timer.start()
    for first in range(0, schedule.total_steps, e):
        count = min(e, schedule.total_steps - first)
        if not timer.passed(first + count, step(first, count), checkpoint):
            break
    return timer.record
