"""The wire between the engine and a trial's child: the ``Request`` the engine writes (request.json)
and the ``Result`` the child writes back, each defined here once and used by both sides.

Framework-free (the engine imports it): only the standard library. The JSON is the one the two
sides have always exchanged: ``to_json()`` gives the object that is written, ``from_json()`` reads
one back.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping


def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def _object(data: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ValueError(f"{what}: expected a JSON object, got {type(data).__name__} {data!r}")
    return data


@dataclass(frozen=True)
class Burst:
    """How a trial measures (trainers/common/protocol.py): the same for every trial of a study. The
    study file's ``[burst]`` is one (``definition.BurstSection`` adds its timeout)."""

    train_samples: int = 12000
    warmup_samples: int = 2000
    windows: int = 5
    min_window_seconds: float = 0.1  # a shorter window is reported, with the train_samples it needs

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> Burst:
        """Missing or null keys keep their defaults; numbers take the field's type (JSON writes 0.0 as 0)."""
        data = _object(data, "request burst")
        unknown = sorted(set(data) - set(_names(cls)))
        if unknown:
            raise ValueError(f"request burst: unknown key(s) {', '.join(unknown)}; expected {', '.join(_names(cls))}")
        return cls(**{f.name: type(f.default)(data[f.name]) for f in fields(cls)  # type: ignore[call-arg]
                      if data.get(f.name) is not None})


@dataclass(frozen=True)
class Request:
    """What a child (probe, burst or diagnose) is asked to do."""

    workload: str | None = None  # a built-in name or "package.module:factory" ("" or None: a script)
    workload_options: dict[str, Any] = field(default_factory=dict)
    script: str | None = None  # the user's training script (absolute path), run with ``args``
    args: tuple[str, ...] = ()
    knobs: dict[str, Any] = field(default_factory=dict)
    burst: Burst = field(default_factory=Burst)
    workdir: str | None = None  # where "package.module:factory" imports from
    lr_scale: float = 1.0
    train_records: int | None = None  # counted once per study by the probe, so no trial reads every file again
    accuracy_required: bool = True  # False: a trial need not report an accuracy ([guard] accuracy = false)
    seed: int = 0  # weights, dropout, data order (written as burst.seed)
    # written only when set:
    target_accuracy: float | None = None  # time-to-accuracy: stop once the held-out accuracy reaches it
    input_variants: dict[str, dict[str, Any]] | None = None  # diagnose: loader overrides per label
    progress_path: str | None = None  # where the child appends each window (the runner sets it)
    guard: bool = True  # the NaN guard (off only to measure its cost)
    sync_debug: bool = False  # CUDA: warn on every synchronisation
    nproc: int = 1  # ranks in the trial's group (data-parallel: trainers/<framework>/group.py)
    solo: bool = False  # a group's trial as one rank alone, on one rank's share (the scaling figure)

    _WHEN_SET = ("target_accuracy", "input_variants", "progress_path", "guard", "sync_debug", "nproc", "solo")

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)
               if f.name != "seed" and not (f.name in self._WHEN_SET and getattr(self, f.name) == f.default)}
        out.update(args=list(self.args), burst={**self.burst.to_json(), "seed": self.seed})
        return out

    @classmethod
    def from_json(cls, data: Any) -> Request:
        """Missing keys keep their defaults; an unknown key is refused (the two sides would disagree
        about what the trial is: a key ignored would measure something else than asked)."""
        data = dict(_object(data, "request"))
        names = set(_names(cls)) - {"seed"}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"request: unknown key(s) {', '.join(unknown)}; expected {', '.join(sorted(names))}")
        burst = dict(_object(data.pop("burst", None) or {}, "request burst"))
        seed = burst.pop("seed", None)
        present = {k: v for k, v in data.items() if v is not None}
        return cls(**{**present, "args": tuple(str(a) for a in present.get("args") or ()),
                      "lr_scale": float(present.get("lr_scale") or 1.0),
                      "burst": Burst.from_json(burst), "seed": int(seed or 0)})


@dataclass(frozen=True)
class Measured:
    """What a burst measured and applied, as the engine keeps it: the fields a trial's record
    (search/storage/record.py) shares with the child's ``Result``, under the same names."""

    samples_per_second: float | None = None
    samples_per_second_cv: float | None = None
    warmup_seconds: float | None = None
    val_accuracy: float | None = None
    final_loss: float | None = None
    effective_batch_size: int | None = None
    peak_memory_mb: float | None = None
    memory_limit_mb: float | None = None
    burst_seconds: float | None = None
    window_rates: list[float] | None = None
    nan_step: int | None = None
    amp_skipped_steps: int | None = None
    loader: dict[str, Any] | None = None  # PyTorch: the DataLoader's settings
    pipeline: dict[str, Any] | None = None  # TensorFlow: the tf.data pipeline
    applied: dict[str, Any] | None = None
    lr_scale: float | None = None
    evaluations: list[dict[str, float]] | None = None
    target_reached: bool | None = None
    time_to_accuracy: float | None = None
    settle_seconds: float | None = None
    settle_samples: int | None = None
    settle_drained: bool | None = None
    short_windows: dict[str, Any] | None = None
    unsettled: dict[str, Any] | None = None
    not_exercised: dict[str, str] | None = None  # knob -> why the script never applied it
    trained_samples: int | None = None
    placement: dict[str, Any] | None = None
    child_start: str | None = None  # fresh | forked
    group: dict[str, Any] | None = None  # a data-parallel trial: ranks, backend, each rank's rate, the slowest


@dataclass(frozen=True)
class Result(Measured):
    """What a child writes back: a burst's measurement and outcome, a probe's fingerprint and
    description, a diagnosis's ceilings, or (alone) the ``error`` of a workload at fault. None: not
    written. The runner adds the window ``segments`` of a pruned trial."""

    outcome: str | None = None  # ok | nan | oom | invalid
    failure: str | None = None
    error: str | None = None  # the user's workload is at fault (exit status 2)
    # the burst's measurement (protocol.BurstRecord.measurement)
    window_samples: list[int] | None = None
    window_seconds: list[float] | None = None
    warmup_samples_measured: int | None = None
    steps: int | None = None
    # what the trial applied and how it ended
    knobs_effective: dict[str, Any] | None = None  # each knob read back from the framework
    setup_seconds: float | None = None
    eval_seconds: float | None = None
    # the probe's and the diagnosis's
    fingerprint: dict[str, Any] | None = None
    workload: dict[str, Any] | None = None
    input_samples_per_second: float | None = None
    compute_samples_per_second: float | None = None
    input_variants: dict[str, float] | None = None
    segments: list[dict[str, Any]] | None = None  # a pruned trial's windows (the runner's)
    # Keys this version does not name, kept as they came: a measurement detail the engine does not
    # read must not cost a trial its result, and to_json(from_json(data)) gives data back.
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)
               if f.name != "extra" and getattr(self, f.name) is not None}
        return {**out, **self.extra}

    @classmethod
    def from_json(cls, data: Any) -> Result:
        data = _object(data, "result")
        names = set(_names(cls)) - {"extra"}
        return cls(**{k: v for k, v in data.items() if k in names},
                   extra={k: v for k, v in data.items() if k not in names})
