"""The production side of the integration API, framework-free: reading an export, comparing
the machine it was measured on with this one, and the watchdog that compares the live rate with
the confirmed one.

A script that calls ``Tuned.load()`` outside a trial runs with the export named by
``$KNOBTUNE_CONFIG`` (or the path it passes), else with its own settings.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

EXPORT_FORMAT = "knobtune.best/1"
CONFIG_ENV = "KNOBTUNE_CONFIG"
WATCHDOG_ENV = "KNOBTUNE_WATCHDOG_S"

log = logging.getLogger("knobtune")


class ConfigError(ValueError):
    """The export given to ``Tuned.load`` cannot be used: missing, unreadable, another format
    or another framework."""


def ensure_logging() -> None:
    """Show knobtune's messages (INFO and up, on stderr) when the script configured no logging."""
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("knobtune: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def config_path(path: str | os.PathLike[str] | None) -> Path | None:
    """The export to load: ``path``, else ``$KNOBTUNE_CONFIG``, else None (the script's own settings)."""
    chosen = path if path is not None else os.environ.get(CONFIG_ENV) or None
    return Path(chosen) if chosen is not None else None


def read_export(path: Path, framework: str) -> dict[str, Any]:
    """The export at ``path``, checked to be a ``knobtune.best/1`` file of ``framework``."""
    where = f"{path} (from ${CONFIG_ENV})" if os.environ.get(CONFIG_ENV) == str(path) else str(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"knobtune config {where}: no such file (write one with `knobtune export NAME -o FILE`)") \
            from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"knobtune config {where}: cannot read it ({exc})") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"knobtune config {where}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"knobtune config {where}: expected a JSON object, got {type(data).__name__}")
    if data.get("format") != EXPORT_FORMAT:
        raise ConfigError(f"knobtune config {where}: format {data.get('format')!r}, expected {EXPORT_FORMAT!r} "
                          f"(what `knobtune export` writes)")
    if data.get("framework") != framework:
        raise ConfigError(f"knobtune config {where}: an export of a {data.get('framework')} study, "
                          f"expected one of a {framework} study")
    if not isinstance(data.get("knobs"), dict):
        raise ConfigError(f"knobtune config {where}: has no 'knobs' object")
    return data


def _gpu_names(fingerprint: dict[str, Any]) -> list[str]:
    return [g.get("name", "?") for g in fingerprint.get("gpus") or []]


def fingerprint_differences(recorded: dict[str, Any], current: dict[str, Any], version_key: str) -> list[str]:
    """What differs between the machine a config was measured on and this one (GPU models,
    usable cores, framework and CUDA versions; the CPU model when neither has a GPU)."""
    out = []
    before, now = _gpu_names(recorded), _gpu_names(current)
    if before != now:
        out.append(f"GPUs {', '.join(before) or 'none'} -> {', '.join(now) or 'none'}")
    elif not now and recorded.get("cpu_model") != current.get("cpu_model"):
        out.append(f"CPU {recorded.get('cpu_model')} -> {current.get('cpu_model')}")
    for key, label in (("usable_cores", "usable cores"), (version_key, version_key), ("cuda_version", "CUDA")):
        if recorded.get(key) != current.get(key):
            out.append(f"{label} {recorded.get(key)} -> {current.get(key)}")
    return out


def expected_rate(config: dict[str, Any]) -> float | None:
    """The samples/s production should reach: the winner's median over its confirmation rounds
    where the search confirmed it, else the winning trial's figure. (The confirmed ``median`` is
    the objective's value, which is not samples/s under ``job_samples`` or time-to-accuracy.)"""
    confirmed = config.get("confirmed") or {}
    if confirmed.get("samples_per_second"):
        return float(confirmed["samples_per_second"])
    if confirmed.get("median") and confirmed.get("unit", "samples/s") == "samples/s":
        return float(confirmed["median"])  # an export written before the rounds' rates were kept
    rate = (config.get("metrics") or {}).get("samples_per_second")
    return float(rate) if rate else None


@dataclass(frozen=True)
class WatchdogSettings:
    """How the production watchdog judges the live rate: every ``interval_s`` of training (one
    device sync each), against the expected rate; a warning after ``patience`` intervals in a
    row below it by more than ``margin``. The first interval (compilation, worker start-up) is
    reported but not judged."""

    interval_s: float = 30.0
    margin: float = 0.2
    patience: int = 2

    @classmethod
    def from_env(cls, interval_s: float | None, margin: float) -> "WatchdogSettings":
        raw = os.environ.get(WATCHDOG_ENV)
        if interval_s is None and raw:
            try:
                interval_s = float(raw)
            except ValueError:
                raise ConfigError(f"${WATCHDOG_ENV}={raw!r}: expected a number of seconds") from None
        interval = cls.interval_s if interval_s is None else float(interval_s)
        if interval <= 0:
            raise ConfigError(f"watchdog interval {interval!r}: expected a number of seconds > 0")
        if not 0 <= margin < 1:
            raise ConfigError(f"watchdog margin {margin!r}: expected a fraction from 0 to below 1")
        return cls(interval_s=interval, margin=margin)


class Watchdog:
    """Samples/s of a running job, measured between device syncs at its own interval (never per
    step), compared with the rate the config was confirmed at.

    ``resume()`` when a pass over the data starts, ``step(samples)`` after each micro-batch (a
    host clock read), ``pause()`` when the pass ends: time outside the passes (the script's own
    evaluation) is not counted. ``compilations()`` (optional) counts the graphs the framework has
    compiled so far: an interval in which it grew (a recompilation: a new input shape, a guard
    that failed) is reported but neither judged nor part of the mean, like the first interval.
    """

    def __init__(self, expected: float | None, settings: WatchdogSettings, sync: Callable[[], None],
                 clock: Callable[[], float] = time.perf_counter,
                 compilations: Callable[[], int] | None = None) -> None:
        self.expected, self.settings, self.sync, self.clock = expected, settings, sync, clock
        self.compilations = compilations or (lambda: 0)
        self.samples = 0          # counted in the current interval
        self.seconds = 0.0        # measured in the current interval before the last resume
        self.mark: float | None = None
        self.intervals: list[tuple[int, float, bool]] = []  # (samples, seconds, judged) per closed interval
        self.compiled = 0         # the compilation count at the current interval's last look
        self.compiling = False    # the current interval's clocked time included a compilation
        self.below = 0            # judged intervals in a row under the threshold
        self.warned = False
        self.total_samples = 0

    @property
    def threshold(self) -> float | None:
        return self.expected * (1 - self.settings.margin) if self.expected else None

    def resume(self) -> None:
        self.compiled = self.compilations()  # what compiled while paused was not on the clock
        self.mark = self.clock()

    def pause(self) -> None:
        if self.mark is not None:
            self.sync()
            self.seconds += self.clock() - self.mark
            self.mark = None
            self._look()

    def step(self, samples: int) -> None:
        self.samples += samples
        self.total_samples += samples
        if self.mark is not None and self.seconds + self.clock() - self.mark >= self.settings.interval_s:
            self._close()

    def _look(self) -> None:
        count = self.compilations()
        self.compiling = self.compiling or count != self.compiled
        self.compiled = count

    def _close(self) -> None:
        self.sync()
        now = self.clock()
        self._look()
        seconds = self.seconds + now - (self.mark if self.mark is not None else now)
        judged = bool(self.intervals) and not self.compiling  # the first: compilation, worker start-up
        self.intervals.append((self.samples, seconds, judged))
        self.samples, self.seconds, self.mark, self.compiling = 0, 0.0, now, False
        rate = self.intervals[-1][0] / seconds if seconds > 0 else 0.0
        if not judged:
            compiling = len(self.intervals) - 1 - max((i for i, (_, _, j) in enumerate(self.intervals) if j), default=0)
            if len(self.intervals) > 1 and compiling == 3:  # said once per streak: the job may never be judged
                log.info("watchdog: torch.compile compiled a graph in 3 intervals in a row (new shapes, failing "
                         "guards?); intervals that compile are not judged")
            return
        expected = f" (confirmed {self.expected:,.0f})" if self.expected else ""
        if sum(j for _, _, j in self.intervals) == 1:
            log.info(f"watchdog: {rate:,.0f} samples/s{expected}")
        threshold = self.threshold
        if threshold is None:
            return
        if rate < threshold:
            self.below += 1
            if self.below == self.settings.patience and not self.warned:
                self.warned = True
                log.warning(
                    f"watchdog: {rate:,.0f} samples/s for {self.below} intervals of {self.settings.interval_s:g} s, "
                    f"{rate / self.expected:.0%} of the confirmed {self.expected:,.0f} (more than "
                    f"{self.settings.margin:.0%} below): another load on this machine, throttling, or a slower "
                    f"data path than the one measured")
        else:
            if self.warned:
                log.info(f"watchdog: back to {rate:,.0f} samples/s{expected}")
            self.below, self.warned = 0, False

    def stats(self) -> dict[str, Any]:
        """The live figures: the last interval's rate and the rate over the judged intervals (after
        warm-up, without the ones that recompiled)."""
        judged = [(n, t) for n, t, j in self.intervals if j]
        samples, seconds = sum(n for n, _ in judged), sum(t for _, t in judged)
        last = self.intervals[-1] if self.intervals else None
        open_seconds = self.seconds + (self.clock() - self.mark if self.mark is not None else 0.0)
        measured = sum(t for _, t, _ in self.intervals) + open_seconds
        return {
            # everything since the first batch, warm-up included, without a sync: a live estimate
            "overall_samples_per_second": self.total_samples / measured if measured > 0 else None,
            "samples_per_second": last[0] / last[1] if last and last[1] > 0 else None,
            "mean_samples_per_second": samples / seconds if seconds > 0 else None,
            "expected_samples_per_second": self.expected,
            "ratio": (samples / seconds) / self.expected if seconds > 0 and self.expected else None,
            "intervals": len(self.intervals),
            "judged_intervals": len(judged),
            "compiling_intervals": sum(not j for _, _, j in self.intervals[1:]),
            "interval_s": self.settings.interval_s,
            "below_threshold": self.below > 0,
            "warned": self.warned,
            "samples": self.total_samples,
        }
