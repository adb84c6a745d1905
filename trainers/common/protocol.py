"""The measurement protocol, shared by every framework (see DESIGN.md, "Measurement protocol").

A burst trains on ``train_samples``. The micro-batches that cover the first ``warmup_samples``
are timed apart (``warmup_seconds``). Then the input pipeline's read-ahead, which piled up while
nothing was consumed during warm-up (DataLoader prefetch queues, tf.data buffers), is trained
through untimed (the *settle* segment, ``settle_seconds``), so that the first window starts in
the steady state. The rest is cut into ``windows`` windows whose boundaries fall on
optimizer-step boundaries where the window is long enough. Each window is timed end to end
(input pipeline included); the device is synchronised and the NaN guard read only at segment
boundaries. ``samples_per_second`` is the median window rate, ``samples_per_second_cv`` the
windows' coefficient of variation. A window shorter than ``min_window_seconds`` is reported
(``short_windows``, with the ``train_samples`` that would give long enough windows).
"""
from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from knobtune.trainers.common.errors import InvalidKnobs
from knobtune.trainers.common.wire import Burst, Request


@dataclass(frozen=True)
class Schedule:
    """Micro-batch indices at which warm-up ends and each window ends (exclusive).

    ``execution_steps`` micro-batches run per host call (Keras ``steps_per_execution``); every
    boundary falls on an execution boundary, so a window is never cut inside a device call.
    ``window_ends`` are the windows when no settling is needed; ``windows_after(start)`` gives
    them once the settle segment has ended at ``start``. ``read_ahead`` is the settle length
    when the pipeline cannot say whether its read-ahead is drained, ``settle_max`` the most it
    may take when it can (both in micro-batches, whole alignment units).
    """

    batch_size: int
    accumulation_steps: int
    total_steps: int
    warmup_steps: int
    window_ends: tuple[int, ...]
    execution_steps: int = 1
    settle_max: int = 0
    min_window_seconds: float = 0.0
    wanted_settle: int = 0  # the read-ahead in whole alignment units, before the burst's room capped it

    @property
    def boundaries(self) -> tuple[int, ...]:
        return (self.warmup_steps, *self.window_ends)

    @property
    def read_ahead(self) -> int:
        """The settle length when the pipeline cannot say whether it is drained."""
        return min(self.settle_max, self.wanted_settle)

    @property
    def align(self) -> int:
        """Micro-batches per alignment unit: whole optimizer steps and whole executions."""
        return math.lcm(self.accumulation_steps, self.execution_steps)

    def windows_after(self, start: int) -> tuple[int, ...]:
        """Window ends when the windows start at micro-batch ``start``."""
        return _window_ends(start, self.total_steps, len(self.window_ends), self.align, self.execution_steps)


def _window_ends(start: int, total: int, windows: int, align: int, execution: int) -> tuple[int, ...]:
    per = (total - start) // windows
    per = per // align * align if per >= align else per // execution * execution
    ends = [start + per * (i + 1) for i in range(windows)]
    ends[-1] = total  # the remainder joins the last window
    return tuple(ends)


def make_schedule(spec: Burst, batch_size: int, accumulation_steps: int = 1,
                  execution_steps: int = 1, read_ahead: int = 0) -> Schedule:
    """Cut a burst into warm-up, settle and windows, counted in micro-batches of ``batch_size``.

    (In time-to-accuracy mode the engine asks for one window per evaluation interval.)

    Warm-up ends on an optimizer step and an execution boundary; windows are whole executions,
    and whole optimizer steps when they are long enough. ``read_ahead`` is how many micro-batches
    the input pipeline can hold ready (workers x prefetch_factor, a prefetch buffer): the settle
    segment after warm-up trains through them untimed, up to twice that when the pipeline can
    say that it is not drained yet, leaving each window at least two optimizer steps. The settle
    comes out of the windows' budget, so every trial trains on the same samples. Raises
    InvalidKnobs when the burst is too short to give every window at least one execution.
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
    if (total - warm) // spec.windows < e:
        raise InvalidKnobs(
            f"burst too short: train_samples={spec.train_samples} minus warm-up leaves "
            f"{(total - warm) * batch_size} samples, fewer than windows={spec.windows} "
            f"executions of {e} micro-batch(es) of batch_size={batch_size}"
        )
    ends = _window_ends(warm, total, spec.windows, step_align, e)
    # the settle may take all but two alignment units per window: windows that are short but
    # measured in the steady state beat long ones that are not (short ones are reported)
    room = max(0, total - warm - spec.windows * max(2 * step_align, e)) // step_align * step_align
    wanted = _align_up(read_ahead, step_align) if read_ahead > 0 else 0
    settle_max = min(room, _align_up(2 * read_ahead, step_align)) if read_ahead > 0 else 0
    return Schedule(batch_size, k, total, warm, ends, e, settle_max, spec.min_window_seconds, wanted)


def _align_up(value: int, align: int) -> int:
    return math.ceil(value / align) * align


@dataclass(frozen=True)
class GuardReading:
    """What a trainer reads off the device at a window boundary (one sync)."""

    finite: bool
    first_bad_step: int | None
    mean_loss: float | None


def group_reading(readings: list[tuple[bool, int | None, float | None]]) -> tuple[bool, int | None, float | None]:
    """The guard of a data-parallel group from each rank's (finite, first bad step, mean loss):
    finite when every rank's losses were, the earliest bad step, the ranks' mean loss."""
    finite = all(f for f, _, _ in readings)
    bad = [b for f, b, _ in readings if not f and b is not None]
    means = [m for _, _, m in readings if m is not None]
    return finite, min(bad) if bad else None, (sum(means) / len(means) if means and finite else None)


@dataclass
class BurstRecord:
    """Timings and guard state of one burst, turned into the result's measurement fields."""

    warmup_seconds: float = 0.0
    warmup_samples: int = 0
    settle_seconds: float = 0.0
    settle_samples: int = 0
    settle_drained: bool | None = None  # the pipeline said its read-ahead was gone (None: it cannot say)
    min_window_seconds: float = 0.0
    # when the read-ahead could not be trained through before the windows: what was wanted and done
    unsettled: dict[str, Any] | None = None
    windows: list[tuple[int, float]] = field(default_factory=list)  # (samples, seconds)
    steps_done: int = 0
    samples_done: int = 0
    nan_step: int | None = None
    final_loss: float | None = None
    evaluations: list[dict[str, float]] = field(default_factory=list)  # time-to-accuracy checkpoints
    target_reached: bool | None = None

    def short_windows(self) -> dict[str, Any] | None:
        """When the shortest window lasted under ``min_window_seconds``: by how much, and the
        ``train_samples`` that would make every window long enough at the measured rates."""
        timed = [(s, t) for s, t in self.windows if t > 0]
        if not timed or self.min_window_seconds <= 0:
            return None
        shortest = min(t for _, t in timed)
        if shortest >= self.min_window_seconds:
            return None
        factor = self.min_window_seconds / shortest
        window_samples = sum(s for s, _ in timed)
        needed = self.warmup_samples + self.settle_samples + math.ceil(window_samples * factor * 1.2)
        return {"shortest_seconds": shortest, "min_window_seconds": self.min_window_seconds,
                "suggested_train_samples": int(math.ceil(needed / 1000) * 1000)}

    def training_seconds(self) -> float:
        return self.warmup_seconds + self.settle_seconds + sum(t for _, t in self.windows)

    def measurement(self) -> dict[str, object]:
        rates = [samples / seconds for samples, seconds in self.windows if seconds > 0]
        out: dict[str, object] = {
            "warmup_seconds": self.warmup_seconds,
            "warmup_samples_measured": self.warmup_samples,
            "settle_seconds": self.settle_seconds,
            "settle_samples": self.settle_samples,
            "window_samples": [s for s, _ in self.windows],
            "window_seconds": [t for _, t in self.windows],
            "window_rates": rates,
            "trained_samples": self.samples_done,
            "steps": self.steps_done,
            "final_loss": self.final_loss,
            "burst_seconds": self.training_seconds(),
        }
        if self.settle_drained is not None:
            out["settle_drained"] = self.settle_drained
        if self.unsettled is not None:
            missing = 2 * self.unsettled["read_ahead_batches"] - self.unsettled["settled_batches"]
            needed = self.samples_done + missing * self.unsettled["batch_size"] * 2  # the windows keep their share
            out["unsettled"] = {**self.unsettled, "suggested_train_samples": int(math.ceil(needed / 1000) * 1000)}
        if rates:
            out["samples_per_second"] = statistics.median(rates)
            mean = statistics.fmean(rates)
            out["samples_per_second_cv"] = statistics.pstdev(rates) / mean if len(rates) > 1 else 0.0
            short = self.short_windows()
            if short:
                out["short_windows"] = short
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


def progress_writer(path: str | None, ranks: int = 1) -> Callable[[dict[str, Any]], None] | None:
    """Append each segment as a JSON line to ``path`` (read by the parent while the child runs).
    ``ranks``: the data-parallel group's size, whose ranks train the same samples in each
    (aligned) segment: the line says the group's samples and rate."""
    if not path:
        return None

    def write(segment: dict[str, Any]) -> None:
        if ranks > 1:
            segment = {**segment, "samples": segment["samples"] * ranks,
                       "rate": segment["rate"] * ranks if segment.get("rate") is not None else None}
        with open(path, "a") as f:
            f.write(json.dumps(segment) + "\n")

    return write


def hooks_from(request: Request, evaluate: Callable[[], float], ranks: int = 1) -> Hooks:
    """The hooks a burst request asks for: progress lines, and evaluation toward a target."""
    target = request.target_accuracy
    return Hooks(progress=progress_writer(request.progress_path, ranks),
                 evaluate=evaluate if target is not None else None, target=target)


class WindowTimer:
    """Stamps the schedule's boundaries: the one timing mechanism every training loop uses.

    Call ``start()`` right before the first micro-batch is requested (so worker start-up and
    compilation land in warm-up), then ``passed(steps_done, samples, reading)`` after each
    execution; it records a segment (warm-up, settle, or a window) when ``steps_done`` is a
    boundary and returns False when the burst must stop (a non-finite loss, a target reached).
    ``drained()`` says whether the input pipeline's read-ahead is used up (None: it cannot say);
    it ends the settle segment early.
    """

    def __init__(self, schedule: Schedule, clock: Callable[[], float] = time.perf_counter,
                 hooks: Hooks | None = None, drained: Callable[[], bool | None] | None = None) -> None:
        self.schedule, self.clock = schedule, clock
        self.hooks = hooks or Hooks()
        self.drained = drained
        self.record = BurstRecord(min_window_seconds=schedule.min_window_seconds)
        if self.hooks.evaluate is not None:
            self.record.target_reached = False
        self._ends: list[int] = []
        self._phase = "warmup"
        if schedule.warmup_steps == 0:
            self._after_warmup(0)
        self._segment_samples = 0
        self._drained: bool | None = None
        self._t0 = 0.0

    def _after_warmup(self, steps_done: int) -> None:
        if self.schedule.settle_max > 0:
            self._phase = "settle"
        else:
            if self.schedule.wanted_settle > 0:  # read-ahead, but no room to train through it
                self._unsettled(0, None)
            self._start_windows(steps_done)

    def _unsettled(self, settled: int, drained: bool | None) -> None:
        self.record.unsettled = {"read_ahead_batches": self.schedule.wanted_settle, "settled_batches": settled,
                                 "drained": drained, "batch_size": self.schedule.batch_size}

    def _start_windows(self, steps_done: int) -> None:
        self._phase = "windows"
        self._ends = list(self.schedule.windows_after(steps_done))

    def start(self) -> None:
        self._t0 = self.clock()

    def _settled(self, steps_done: int) -> bool:
        s = self.schedule
        done = steps_done - s.warmup_steps
        if done <= 0 or done % s.align:
            return False
        self._drained = self.drained() if self.drained else None
        if done >= s.settle_max:
            return True
        return done >= s.read_ahead if self._drained is None else self._drained

    def due(self, steps_done: int) -> bool:
        if self._phase == "warmup":
            return steps_done == self.schedule.warmup_steps
        if self._phase == "settle":
            return self._settled(steps_done)
        return bool(self._ends) and steps_done == self._ends[0]

    def passed(self, steps_done: int, samples: int, reading: Callable[[], GuardReading]) -> bool:
        """Count ``samples`` trained up to ``steps_done``; at a boundary, read the guard and stamp."""
        self._segment_samples += samples
        self.record.steps_done = steps_done
        if not self.due(steps_done):
            return True
        guard = reading()  # synchronises the device
        now = self.clock()
        phase = self._phase
        seconds = now - self._t0
        if phase == "warmup":
            self.record.warmup_seconds = seconds
            self.record.warmup_samples = self._segment_samples
            self._after_warmup(steps_done)
        elif phase == "settle":
            self.record.settle_seconds = seconds
            self.record.settle_samples = self._segment_samples
            self.record.settle_drained = self._drained
            settled = steps_done - self.schedule.warmup_steps
            # Not drained after twice the read-ahead at full speed: the pipeline nearly keeps up, and
            # what is left barely inflates the windows. Only a settle the burst's room cut short is reported.
            limit = 2 * self.schedule.wanted_settle if self._drained is False else self.schedule.wanted_settle
            if self._drained is not True and settled < limit:
                self._unsettled(settled, self._drained)
            self._start_windows(steps_done)
        else:
            self.record.windows.append((self._segment_samples, seconds))
            self._ends.pop(0)
            if not self._ends:
                self._phase = "done"
        self.record.samples_done += self._segment_samples
        self.record.final_loss = guard.mean_loss
        go_on = guard.finite
        if not guard.finite:
            self.record.nan_step = guard.first_bad_step if guard.first_bad_step is not None else steps_done - 1
        window = phase == "windows"
        if self.hooks.progress:
            self.hooks.progress({"warmup": not window, "phase": phase, "samples": self._segment_samples,
                                 "seconds": seconds, "rate": self._segment_samples / seconds if seconds > 0 else None,
                                 "steps": steps_done})
        if go_on and window and self.hooks.evaluate is not None:
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
    drained: Callable[[], bool | None] | None = None,
) -> BurstRecord:
    """Run the burst as executions of ``schedule.execution_steps`` micro-batches and time it.

    ``step(first, count)`` trains on micro-batches first..first+count-1 and returns their sample
    count without synchronising; ``checkpoint()`` synchronises and reads the NaN guard, and is
    called only at boundaries; ``drained()`` (optional) says whether the pipeline's read-ahead is
    used up. A non-finite loss stops the burst at the next boundary.
    """
    timer = WindowTimer(schedule, clock, hooks, drained)
    e = schedule.execution_steps
    timer.start()
    for first in range(0, schedule.total_steps, e):
        count = min(e, schedule.total_steps - first)
        if not timer.passed(first + count, step(first, count), checkpoint):
            break
    return timer.record
