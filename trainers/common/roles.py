"""The roles a ``Tuned`` plays, framework-free. Why the script runs decides what its calls do: a
trial measures a burst, the diagnosis measures the input and compute ceilings, the probe
describes the workload, production runs an export's knobs under a watchdog, and without a
config the script's own settings apply. Each role is a driver: ``TunedBase._choose`` picks one
once, when the ``Tuned`` is made, and the ``Tuned``'s calls hand it what depends on the role.

Here are the parts every framework shares: ``Driver`` (what a role does unless it says
otherwise), ``Measuring`` (the trial's and the diagnosis's: a trial's knobs, its report, its
outcome) and ``Diagnosing`` (the diagnosis's result). Each framework's ``roles.py`` has the
drivers themselves, the same names in both: ``TrialDriver``, ``DiagnoseDriver``, ``ProbeDriver``,
``DefaultDriver``, ``ProductionDriver``, over a framework ``Driver``; the trial's and the
diagnosis's mix in ``Measuring`` and ``Diagnosing``.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from knobtune.trainers.common.errors import InvalidKnobs
from knobtune.trainers.common.production import Watchdog, WatchdogSettings, expected_rate, log
from knobtune.trainers.common.script import ScriptDone
from knobtune.trainers.common.wire import Result

if TYPE_CHECKING:
    from knobtune.trainers.common.tuned import Trial, TunedBase


class Driver:
    """One role of a ``Tuned`` (``kt``), made once with it: the trial the child runs (None outside
    a child), the export (production) and the watchdog's settings. The base is what a role
    does unless it says otherwise: the script's own settings, a knob that cannot apply is a
    warning, ``report`` logs, ``stats`` are the watchdog's."""

    def __init__(self, kt: TunedBase, trial: Trial | None = None, config: dict[str, Any] | None = None,
                 settings: WatchdogSettings | None = None) -> None:
        self.kt, self.trial, self.config = kt, trial, config
        self.lr_scale = trial.request.lr_scale if trial else float((config or {}).get("lr_scale") or 1.0)
        self.guarded = not trial or trial.request.guard
        self.watchdog = Watchdog(expected_rate(config) if config else None, settings or WatchdogSettings(),
                                 self.watch, compilations=self.compilations)

    def watch(self) -> None:
        """The watchdog's interval boundary: wait for the device (a framework's driver says how)."""

    def compilations(self) -> int:
        """Graphs the framework compiled so far (the watchdog leaves out intervals that compiled)."""
        return 0

    def check(self) -> None:
        """Before the knobs apply: refuse a value this machine cannot train with (a trial's)."""

    def refuse(self, why: str, instead: str = "") -> None:
        """A knob that cannot apply here: a warning, and the run goes on ``instead``."""
        log.warning(why + instead)

    def report(self, val_accuracy: Any, metrics: dict[str, Any]) -> None:
        """What ``kt.report`` does once the accuracy is checked: log it."""
        log.info("report: " + ", ".join(f"{k}={v}" for k, v in {"val_accuracy": val_accuracy, **metrics}.items()
                                        if v is not None))

    def stats(self) -> dict[str, Any]:
        return {**self.watchdog.stats(), "knobs": self.kt.knobs_effective()}  # type: ignore[attr-defined]

    def result(self) -> Result:
        raise RuntimeError("only a trial's or a diagnosis's Tuned has a result")

    def close(self) -> None:
        """Release what the role holds, once its result is taken."""


class Measuring(Driver):
    """The trial's and the diagnosis's: every knob is the trial's and checked (one that cannot
    apply ends the trial invalid), and ``report`` after the burst ends the script."""

    trial: Trial

    def refuse(self, why: str, instead: str = "") -> None:
        raise InvalidKnobs(why)

    def report(self, val_accuracy: Any, metrics: dict[str, Any]) -> None:
        trial = self.trial
        trial.metrics.update(metrics)
        if trial.started and trial.burst_end is not None:
            trial.accuracy = self.kt.accuracy
            trial.eval_seconds = time.perf_counter() - trial.burst_end
            raise ScriptDone

    def stats(self) -> dict[str, Any]:
        """The burst's measurement so far, once it started."""
        trial = self.trial
        record = trial.record or (trial.timer.record if trial.timer is not None else None)
        return record.measurement() if record is not None else super().stats()

    def outcome(self, stopped: str) -> dict[str, Any]:
        """The trial's outcome, as ``Result`` fields: nan (with the step), invalid (the script left
        the burst early: ``stopped`` says how, formatted with ``done`` and ``total`` micro-batches;
        or it never reported its accuracy though the study needs it), else ok with the accuracy."""
        trial = self.kt.result_check()
        record, schedule = trial.record, trial.schedule
        assert record is not None and schedule is not None
        out: dict[str, Any] = {"eval_seconds": trial.eval_seconds}
        if record.nan_step is not None:
            out.update(outcome="nan", failure=f"loss became non-finite at step {record.nan_step} of "
                                              f"{schedule.total_steps}")
        elif not trial.completed:
            out.update(outcome="invalid", failure=stopped.format(done=trial.stopped_at, total=schedule.total_steps))
        elif trial.accuracy is None and trial.request.accuracy_required:
            out.update(outcome="invalid", failure="the script never reported its accuracy: call "
                                                  "kt.report(val_accuracy=...) after training (or turn the "
                                                  "accuracy guard off: [guard] accuracy = false)")
        else:
            out.update(outcome="ok", val_accuracy=trial.accuracy)
        return out


class Diagnosing(Measuring):
    """The diagnosis's result: its two ceilings instead of a burst's measurement."""

    diagnosis: Result | None = None

    def ceilings(self, inputs: dict[str, float], compute: float) -> None:
        """The input ceiling of each variant (samples/s), and the compute ceiling."""
        self.diagnosis = Result(outcome="ok", input_samples_per_second=max(inputs.values()), input_variants=inputs,
                                compute_samples_per_second=compute)

    def result(self) -> Result:
        self.kt.result_check()
        assert self.diagnosis is not None
        return self.diagnosis
