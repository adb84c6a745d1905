"""The framework-free half of the integration API (``trainers/<framework>/tuned.py``): a trial's
state inside its child, the production export loaded and checked, the accuracy report, the
knobs a script never exercised, and a child's run of a request.

Each framework's ``Tuned`` subclasses ``TunedBase`` and adds the calls that touch its framework
(building the input pipeline, preparing the model, the step); what a call does that depends on
the role (trial, diagnose, probe, production, default) is its driver's (trainers/common/roles.py,
trainers/<framework>/roles.py).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from knobtune.trainers.common import production, script
from knobtune.trainers.common.errors import WorkloadError
from knobtune.trainers.common.production import ConfigError, WatchdogSettings, log
from knobtune.trainers.common.protocol import BurstRecord, Schedule, WindowTimer
from knobtune.trainers.common.script import ScriptDone
from knobtune.trainers.common.wire import Request, Result

if TYPE_CHECKING:
    from knobtune.trainers.common.roles import Driver


@dataclass
class Trial:
    """A trial's state inside its child: the request, the burst's timer and what the script did."""

    request: Request
    loaded: bool = False
    started: bool = False
    completed: bool = False
    stopped_at: int | None = None  # the script's training stopped early, after this many micro-batches
    timer: WindowTimer | None = None
    record: BurstRecord | None = None  # the burst's measurement (the timer's, or a driven loop's)
    schedule: Schedule | None = None
    data: Any = None  # what the burst trained on (a DataLoader, a tf.data.Dataset)
    accuracy: float | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    setup_seconds: float | None = None
    burst_end: float | None = None
    eval_seconds: float | None = None

    @property
    def script(self) -> bool:
        """Whether the trial runs the user's own script (else the built-in loop over a Workload)."""
        return bool(self.request.script)


def export_knobs(path: str | os.PathLike[str] | None, framework: str, *, version_key: str,
                 fingerprint: Callable[[], dict[str, Any]], defaults: dict[str, Any],
                 problems: Callable[[dict[str, Any]], dict[str, str]], strict: bool
                 ) -> tuple[Path, dict[str, Any], dict[str, Any]] | None:
    """The export at ``path`` or ``$KNOBTUNE_CONFIG`` as (path, config, knobs), or None when
    there is none. Checked: its format and framework (ConfigError); a different machine or
    software is a warning naming the differences; knobs this version does not know are
    ignored with a warning; a knob ``problems`` says this machine cannot apply falls back to
    ``defaults`` with a warning, or raises ConfigError with ``strict``."""
    chosen = production.config_path(path)
    if chosen is None:
        log.info(f"no config (${production.CONFIG_ENV} is not set): running with the script's own settings")
        return None
    config = production.read_export(chosen, framework)
    differences = production.fingerprint_differences(config.get("fingerprint") or {}, fingerprint(), version_key)
    if differences:
        log.warning(f"{chosen} was measured on a different machine or software ({'; '.join(differences)}): "
                    f"its speed may not hold here")
    knobs = {k: v for k, v in config["knobs"].items() if k in defaults}
    unknown = sorted(set(config["knobs"]) - set(defaults))
    if unknown:
        log.warning(f"{chosen}: knobs this version does not know are ignored: {', '.join(unknown)}")
    for name, why in problems(knobs).items():
        if strict:
            raise ConfigError(f"{chosen}: {why} (strict=True refuses to fall back)")
        log.warning(f"{chosen}: {why}; running with {name}={defaults[name]!r} instead")
        knobs[name] = defaults[name]
    shown = ", ".join(f"{k}={v}" for k, v in knobs.items() if v != defaults.get(k))
    log.info(f"loaded {chosen}: trial #{config.get('trial')} of study {config.get('study')!r} ({shown})")
    return chosen, config, knobs


class TunedBase:
    """What every framework's ``Tuned`` does alike: its role's driver (``_choose``), the accuracy
    report, the live figures, the result. A subclass sets ``used`` (the API calls the script
    made) and ``created``, names its drivers in ``DRIVERS`` (role -> driver class), in
    ``EXERCISED_BY`` the call that applies each knob, in ``START_HINT`` the call that starts the
    burst."""

    DRIVERS: ClassVar[dict[str, type[Driver]]] = {}
    EXERCISED_BY: ClassVar[dict[str, tuple[tuple[str, ...], str]]] = {}
    START_HINT: ClassVar[str] = ""

    driver: Driver
    used: set[str]
    created: float
    accuracy: float | None = None
    lr_scale: float
    guarded: bool

    def _choose(self, role: str, trial: Trial | None, config: dict[str, Any] | None,
               settings: WatchdogSettings | None) -> None:
        """The one place the role is read: its driver serves this Tuned from now on."""
        self.driver = self.DRIVERS[role](self, trial, config, settings)
        # read at every step (kt.backward): the Tuned's own attributes
        self.lr_scale, self.guarded = self.driver.lr_scale, self.driver.guarded

    @property
    def trial(self) -> Trial | None:
        """The trial this child runs (None outside a trial's, diagnosis's or probe's child)."""
        return self.driver.trial

    def report(self, val_accuracy: float | None = None, **metrics: Any) -> None:
        """The script's held-out accuracy (in [0, 1]). In a trial, once the burst is over, this
        ends the script: its remaining epochs are not run."""
        if val_accuracy is not None:
            value = float(val_accuracy)
            if not 0.0 <= value <= 1.0:
                raise WorkloadError(f"kt.report(val_accuracy={val_accuracy!r}): expected a fraction in [0, 1]")
            self.accuracy = value
        self.driver.report(val_accuracy, metrics)

    def stats(self) -> dict[str, Any]:
        """Live figures: in production the watchdog's (last interval's and mean samples/s against
        the confirmed rate) and the knobs read back; in a trial the burst's measurement so far."""
        return self.driver.stats()

    def result(self) -> Result:
        """The trial's result (what the child writes): measurements, knobs read back, accuracy,
        the outcome; or the diagnosis."""
        return self.driver.result()

    def close(self) -> None:
        """Release what the trial holds (loader workers ...) once its result is taken."""
        self.driver.close()

    def uncalled(self) -> dict[str, str]:
        """Knob -> why it was not applied, for each call of ``EXERCISED_BY`` the script never made."""
        out: dict[str, str] = {}
        for call, (names, why) in self.EXERCISED_BY.items():
            if call not in self.used:
                out.update({name: why for name in names})
        return out

    def result_check(self) -> Trial:
        """The trial, once the script has loaded the API and started its burst."""
        trial = self.trial
        assert trial is not None
        if not trial.loaded:
            raise WorkloadError("the script never called Tuned.load(): knobtune cannot apply the trial's knobs")
        if not trial.started:
            raise WorkloadError(f"the script never started batches: {self.START_HINT}")
        return trial


def run_request(request: Request, role: str, for_request: Callable[[Request, str], TunedBase],
                train: Callable[[Request], None],
                oom_reason: Callable[[BaseException, TunedBase], str | None]) -> Result:
    """A trial child's result: the built-in loop (``train(request)``, over its workload) or the
    request's ``script`` run with ``args``, both through the integration API that
    ``for_request`` activates; measurements, knobs read back and accuracy, or an oom outcome.
    Everything (the data, the model, training, evaluation) runs inside the out-of-memory handling."""
    kt = for_request(request, role)
    try:
        if request.script:
            script.run(request.script, list(request.args))
        else:
            try:
                train(request)
            except ScriptDone:
                pass
        return kt.result()
    except Exception as exc:
        reason = oom_reason(exc, kt)
        if reason is None:
            raise
        return Result(outcome="oom", failure=reason)
    finally:
        kt.close()
