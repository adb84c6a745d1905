"""The trial record: what one trial stored, as one frozen type, and the study's own attributes.

This is the only module that knows the user attributes' names. The engine writes a trial with
``write(trial, record)`` and every presenter reads ``TrialRecord.of(frozen_trial)``; the names
stored are the contract of DESIGN.md and optuna-dashboard's columns, so they do not change, and
a study stored by an older knobtune reads the same (a missing attribute is ``None``). Attributes
this version does not know are kept in ``extra`` and written back unchanged.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

import optuna
from optuna.trial import FrozenTrial

from knobtune.trainers.common.wire import Measured


@dataclass(frozen=True)
class KnobEntry:
    """One knob of a trial: the value it ran with, whether it applied, and why not."""

    value: Any
    applied: bool = True
    why: str | None = None

    @classmethod
    def from_attr(cls, attr: Mapping[str, Any]) -> KnobEntry:
        return cls(attr.get("value"), bool(attr.get("applied", True)), attr.get("why"))

    def as_attr(self) -> dict[str, Any]:
        out: dict[str, Any] = {"value": self.value, "applied": self.applied}
        if self.why is not None:
            out["why"] = self.why
        return out


@dataclass(frozen=True)
class TrialRecord(Measured):
    """Every user attribute a trial stores, typed. ``None``: not measured or not applicable. What
    the child measured are the wire's ``Measured`` fields (trainers/common/wire.py), the same as
    its ``Result``'s; the rest is the engine's."""

    # where it came from
    outcome: str | None = None  # ok | nan | oom | timeout | crash | invalid | pruned
    is_baseline: bool | None = None
    source: str | None = None  # baseline | advice | explore | warm-start | tpe | random | ...
    role: str | None = None
    warm_start_from: dict[str, Any] | None = None
    retry_of: int | None = None
    duplicate_of: int | None = None
    worker: str | None = None
    worker_cores: list[int] | None = None
    partition: dict[str, Any] | None = None
    # what it ran with
    knobs: Mapping[str, KnobEntry] = field(default_factory=dict)
    # what it measured
    effective_samples_per_second: float | None = None
    noisy: bool | None = None
    trial_seconds: float | None = None
    overhead_seconds: float | None = None
    time_saved_seconds: float | None = None
    memory_fraction: float | None = None
    # what it learned
    accuracy_reached: float | None = None
    accuracy_floor: float | None = None
    baseline_runs: list[dict[str, Any]] | None = None
    baseline_accuracies: list[float] | None = None
    # the verdict
    feasible: bool | None = None
    failure: str | None = None
    output_tail: str | None = None
    # stored attributes this version does not name (kept as they are)
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> TrialRecord:
        """The record of stored user attributes (missing ones are ``None``)."""
        known = {k: v for k, v in attrs.items() if k in _FIELDS}
        known["knobs"] = {name: KnobEntry.from_attr(entry) for name, entry in (attrs.get("knobs") or {}).items()}
        return cls(**known, extra={k: v for k, v in attrs.items() if k not in _FIELDS and k != "extra"})

    @classmethod
    def of(cls, trial: FrozenTrial | optuna.Trial) -> TrialRecord:
        return cls.from_attrs(trial.user_attrs)

    def attrs(self) -> dict[str, Any]:
        """The user attributes to store: every field that is set, under its contract name."""
        out: dict[str, Any] = dict(self.extra)
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("extra", "knobs") or value is None:
                continue
            out[f.name] = value
        if self.knobs:
            out["knobs"] = {name: entry.as_attr() for name, entry in self.knobs.items()}
        return out

    def but(self, **changes: Any) -> TrialRecord:
        """A copy with ``changes`` (the record is frozen)."""
        return dataclasses.replace(self, **changes)

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    @property
    def rate(self) -> float | None:
        """The throughput a trial is ranked by: effective samples/s when the study plans a job length."""
        return self.effective_samples_per_second if self.effective_samples_per_second is not None \
            else self.samples_per_second

    @property
    def knob_values(self) -> dict[str, Any]:
        """Every knob's effective value (applied or not)."""
        return {name: entry.value for name, entry in self.knobs.items()}

    @property
    def applied_knobs(self) -> dict[str, Any]:
        """The knobs that applied, with their effective values."""
        return {name: entry.value for name, entry in self.knobs.items() if entry.applied}

    @property
    def measured_accuracies(self) -> list[float]:
        """Every held-out accuracy measured for this trial (a baseline's runs with different seeds)."""
        if self.baseline_accuracies:
            return list(self.baseline_accuracies)
        return [self.val_accuracy] if self.val_accuracy is not None else []


_FIELDS = {f.name for f in dataclasses.fields(TrialRecord)} - {"extra"}


def write(trial: optuna.Trial, record: TrialRecord) -> None:
    """Store ``record`` as ``trial``'s user attributes (before it is told)."""
    for key, value in record.attrs().items():
        trial.set_user_attr(key, value)


def _named(fields: dict[str, Any], names: set[str], what: str) -> dict[str, Any]:
    unknown = set(fields) - names
    if unknown:
        raise TypeError(f"not {what} record fields: {sorted(unknown)}; expected some of {sorted(names)}")
    return fields


def _stored(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` of a trial as they are stored (names checked; knob entries as attributes)."""
    return {k: v for k, v in TrialRecord(**_named(fields, _FIELDS, "trial")).attrs().items() if k in fields}


def mark(trial: optuna.Trial, **fields: Any) -> None:
    """Store some of a trial's fields now (its worker, why it was skipped, ...); names are checked."""
    for key, value in _stored(fields).items():
        trial.set_user_attr(key, value)


def mark_stored(storage: optuna.storages.BaseStorage, trial_id: int, **fields: Any) -> None:
    """``mark`` through the storage itself (a trial another worker holds, known by its id)."""
    for key, value in _stored(fields).items():
        storage.set_trial_user_attr(trial_id, key, value)


def queued(**fields: Any) -> dict[str, Any]:
    """The user attributes a trial is enqueued with (``is_baseline``, ``source``, ``retry_of``, ...)."""
    return TrialRecord(**fields).attrs()


@dataclass(frozen=True)
class StudyRecord:
    """A study's own user attributes."""

    definition: dict[str, Any] = field(default_factory=dict)  # the parsed study file
    fingerprint: dict[str, Any] = field(default_factory=dict)
    knobtune_version: str | None = None
    measurement: str | None = None  # what makes two studies' figures comparable
    partition: dict[str, Any] | None = None  # the share of the machine each trial ran on (--jobs)
    confirmed: dict[str, Any] | None = None  # the confirmation's record (confirm.py)
    diagnosis: dict[str, Any] | None = None
    scaling: dict[str, Any] | None = None  # a data-parallel study's group against one rank (scaling.py)
    roles: dict[str, str] | None = None
    advice_enqueued: bool = False
    warm_start: dict[str, Any] | None = None

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> StudyRecord:
        return cls(**{k: v for k, v in attrs.items() if k in _STUDY_FIELDS and v is not None})

    @classmethod
    def of(cls, study: optuna.Study) -> StudyRecord:
        return cls.from_attrs(study.user_attrs)

    @property
    def framework(self) -> str | None:
        return self.definition.get("study", {}).get("framework")

    @property
    def objective(self) -> str:
        return self.definition.get("study", {}).get("objective", "throughput")

    def section(self, name: str) -> dict[str, Any]:
        """One section of the stored study file (``study``, ``burst``, ``guard``, ``confirm``, ...)."""
        return self.definition.get(name) or {}


_STUDY_FIELDS = {f.name for f in dataclasses.fields(StudyRecord)}


def mark_study(study: optuna.Study, **fields: Any) -> None:
    """Store some of a study's own attributes; names are checked."""
    for key, value in _named(fields, _STUDY_FIELDS, "study").items():
        study.set_user_attr(key, value)


