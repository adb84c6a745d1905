"""Study files (TOML) parsed into validated dataclasses. Every error names the file and what
was expected; unknown keys name the allowed ones."""
from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

from knobtune.search.errors import UserError
from knobtune.spaces import FRAMEWORKS, for_framework
from knobtune.trainers.common.names import BUILTIN_WORKLOADS
from knobtune.trainers.common.wire import Burst

SAMPLERS = ("effects", "tpe", "random")
OBJECTIVES = ("throughput", "pareto", "time-to-accuracy")
LR_SCALINGS = ("none", "linear", "sqrt")


@dataclass(frozen=True)
class StudySection:
    name: str
    framework: str
    workload: str = ""                       # a built-in or "package.module:factory" (or script instead)
    script: str | None = None                # the user's own training script (absolute path)
    args: tuple[str, ...] = ()               # the script's command-line arguments
    storage: str | None = None
    trials: int = 20
    seed: int | None = None
    sampler: str = "effects"
    description: str = ""
    objective: str = "throughput"
    target_accuracy: float | None = None     # time-to-accuracy: the accuracy to reach
    eval_every_samples: int | None = None    # time-to-accuracy: samples between evaluations
    job_samples: int | None = None           # the planned production run, for warm-up amortisation
    lr_scaling: str = "none"                 # rescale the learning rate with the effective batch
    prune_below: float = 0.5                 # prune a trial whose first windows run under this x best (0: off)
    warm_start: tuple[str, ...] = ()         # earlier studies whose winners and top trials are queued first
    warm_start_top_k: int = 3                # each source's best trials queued after the winners
    nproc: int | str = 1                     # ranks/replicas per trial (data-parallel), or "auto": one per visible GPU

    @property
    def job(self) -> str:
        """What the study trains, for messages: the workload, or the script and its arguments."""
        if self.script:
            return " ".join(["script", Path(self.script).name, *self.args])
        return self.workload

    @property
    def members(self) -> str:
        """A data-parallel trial's members, for messages: PyTorch's ranks (a process each, DDP) or
        TensorFlow's replicas (MirroredStrategy's devices, in one process)."""
        return "replicas" if self.framework == "tensorflow" else "ranks"


@dataclass(frozen=True)
class ConfirmSection:
    """Re-measuring the top candidates and the baseline, interleaved, after the search."""

    top_k: int = 3
    repeats: int = 3
    noisy_repeats: int = 5
    noise_cv: float = 0.05  # a trial whose window rates vary more than this is "noisy"
    min_speedup: float = 0.03  # a candidate replaces the baseline only when its paired median is this much faster


@dataclass(frozen=True)
class BurstSection(Burst):
    """[burst]: how every trial measures (the child's ``Burst``), and how long a trial may take."""

    timeout_s: float = 300.0


@dataclass(frozen=True)
class GuardSection:
    accuracy: bool = True  # false: trials need not report an accuracy, and none is compared (throughput only)
    max_accuracy_drop: float = 0.02
    baseline_runs: int = 2  # the baseline is measured this many times (seeds seed, seed+1, ...)
    max_memory_fraction: float = 0.9  # a trial whose peak memory passes this share of what it may use is infeasible


@dataclass(frozen=True)
class Definition:
    study: StudySection
    burst: BurstSection = field(default_factory=BurstSection)
    guard: GuardSection = field(default_factory=GuardSection)
    baseline: dict[str, Any] = field(default_factory=dict)
    space: dict[str, list[Any]] = field(default_factory=dict)
    workload: dict[str, Any] = field(default_factory=dict)
    confirm: ConfirmSection = field(default_factory=ConfirmSection)
    effective_batch_size: int | None = None  # [space] effective_batch_size: batch x accumulation fixed
    source: str = "<string>"

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("source")
        return data

    def measurement_key(self) -> dict[str, Any]:
        """What must not change when a study resumes, or its trials would not compare."""
        data = self.as_dict()
        burst = dict(data["burst"])
        burst.pop("timeout_s")
        burst.pop("min_window_seconds")  # changes what is reported, not what is measured
        guard = dict(data["guard"])
        if guard.get("accuracy", True):  # the default: keys of studies made before it existed stay equal
            guard.pop("accuracy", None)
        if guard.get("max_memory_fraction", 0.9) == 0.9:  # (likewise)
            guard.pop("max_memory_fraction", None)
        study = self.study
        key = {
            "framework": study.framework,
            "workload": study.workload,
            "workload_options": data["workload"],
            "burst": burst,
            "guard": guard,
            "baseline": data["baseline"],
            "space": data["space"],
            "effective_batch_size": self.effective_batch_size,
            "objective": {"mode": study.objective, "target_accuracy": study.target_accuracy,
                          "eval_every_samples": study.eval_every_samples, "job_samples": study.job_samples,
                          "lr_scaling": study.lr_scaling},
        }
        if study.nproc != 1:  # (likewise: one-process studies' keys stay equal)
            key["nproc"] = study.nproc
        if study.script:  # only script studies have these (older studies' keys stay equal)
            key.update(script=study.script, args=list(study.args))
        return key

    def burst_windows(self) -> int:
        """Windows per burst: [burst] windows, or one per evaluation in time-to-accuracy mode."""
        burst, every = self.burst, self.study.eval_every_samples
        if self.study.objective != "time-to-accuracy" or not every:
            return burst.windows
        return max(1, (burst.train_samples - burst.warmup_samples) // every)


# section -> key -> (accepted types, a description of what is expected)
_NUMBER = (int, float)
_SECTIONS: dict[str, dict[str, tuple[tuple[type, ...], str]]] = {
    "study": {
        "name": ((str,), "a string"),
        "framework": ((str,), f"one of {', '.join(FRAMEWORKS)}"),
        "workload": ((str,), "a built-in workload name or 'package.module:factory'"),
        "script": ((str,), "the path of your training script (relative to the study file)"),
        "args": ((list,), "an array of the script's command-line arguments (strings)"),
        "storage": ((str,), "an SQLAlchemy URL"),
        "trials": ((int,), "an integer >= 1"),
        "seed": ((int,), "an integer"),
        "sampler": ((str,), f"one of {', '.join(SAMPLERS)}"),
        "description": ((str,), "a string"),
        "objective": ((str,), f"one of {', '.join(OBJECTIVES)}"),
        "target_accuracy": (_NUMBER, "a number between 0 and 1"),
        "eval_every_samples": ((int,), "an integer >= 1"),
        "job_samples": ((int,), "an integer >= 1"),
        "lr_scaling": ((str,), f"one of {', '.join(LR_SCALINGS)}"),
        "prune_below": (_NUMBER, "a number between 0 and 1 (0 turns pruning off)"),
        "warm_start": ((list,), "an array of names of earlier studies in the same storage"),
        "warm_start_top_k": ((int,), "an integer >= 0 (each source's best trials queued after the winners)"),
        "nproc": ((int, str), "an integer >= 1 (data-parallel ranks or replicas per trial) or \"auto\" "
                              "(one per visible GPU)"),
    },
    "burst": {
        "train_samples": ((int,), "an integer >= 1"),
        "warmup_samples": ((int,), "an integer >= 0, below train_samples"),
        "windows": ((int,), "an integer >= 1"),
        "timeout_s": (_NUMBER, "a number of seconds > 0"),
        "min_window_seconds": (_NUMBER, "a number of seconds >= 0 (0: no check)"),
    },
    "guard": {"accuracy": ((bool,), "true or false (false: no accuracy is needed or compared)"),
              "max_accuracy_drop": (_NUMBER, "a number between 0 and 1"),
              "baseline_runs": ((int,), "an integer >= 1"),
              "max_memory_fraction": (_NUMBER, "a number above 0, at most 1")},
    "confirm": {
        "top_k": ((int,), "an integer >= 0 (0 turns confirmation off)"),
        "repeats": ((int,), "an integer >= 1"),
        "noisy_repeats": ((int,), "an integer >= 1"),
        "noise_cv": (_NUMBER, "a number > 0"),
        "min_speedup": (_NUMBER, "a number >= 0 (0.03: a candidate must be 3 % faster side by side)"),
    },
}
_FREE_SECTIONS = ("baseline", "space", "workload")  # keys checked against the knobs / the factory
_ALL_SECTIONS = (*_SECTIONS, *_FREE_SECTIONS)


def _type_name(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "float", str: "string", list: "array", dict: "table"}.get(
        type(value), type(value).__name__
    )


def _section(raw: Mapping[str, Any], name: str, where: str) -> dict[str, Any]:
    table = raw.get(name, {})
    if not isinstance(table, dict):
        raise UserError(f"{where}: [{name}] must be a table, got {_type_name(table)}")
    allowed = _SECTIONS[name]
    out: dict[str, Any] = {}
    for key, value in table.items():
        if key not in allowed:
            raise UserError(f"{where}: unknown key {key!r} in [{name}]; allowed: {', '.join(allowed)}")
        types, expected = allowed[key]
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            raise UserError(f"{where}: [{name}] {key} must be {expected}, got {_type_name(value)} {value!r}")
        out[key] = value
    return out


def _check_range(ok: bool, where: str, what: str, expected: str, value: Any) -> None:
    if not ok:
        raise UserError(f"{where}: {what} must be {expected}, got {value!r}")


def parse(text: str, source: str = "<string>", default_name: str | None = None,
          base_dir: Path | None = None) -> Definition:
    """Parse and validate a study file's text (``base_dir``: where a relative script is)."""
    where = source
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{where} is not valid TOML: {exc}") from None
    for section in raw:
        if section not in _ALL_SECTIONS:
            raise UserError(f"{where}: unknown section [{section}]; allowed: {', '.join(_ALL_SECTIONS)}")

    study = _section(raw, "study", where)
    if "framework" not in study:
        raise UserError(f"{where}: [study] needs 'framework' ({_SECTIONS['study']['framework'][1]})")
    if ("workload" in study) == ("script" in study):
        raise UserError(f"{where}: [study] needs exactly one of 'workload' ({_SECTIONS['study']['workload'][1]}) "
                        f"or 'script' ({_SECTIONS['study']['script'][1]})")
    if "name" not in study:
        if not default_name:
            raise UserError(f"{where}: [study] needs 'name'")
        study["name"] = default_name
    framework = study["framework"]
    if framework not in FRAMEWORKS:
        raise UserError(f"{where}: unknown framework {framework!r}; expected one of {', '.join(FRAMEWORKS)}")
    if "script" in study:
        study["script"], study["args"] = _script(study, where, base_dir)
    elif "args" in study:
        raise UserError(f"{where}: [study] args are a script's arguments; this study has no 'script'")
    workload = study.get("workload")
    if workload is not None and workload not in BUILTIN_WORKLOADS[framework] and ":" not in workload:
        raise UserError(
            f"{where}: unknown {framework} workload {workload!r}; built-ins: "
            f"{', '.join(BUILTIN_WORKLOADS[framework])}, or 'package.module:factory' for your own"
        )
    if study.get("sampler", StudySection.sampler) not in SAMPLERS:
        raise UserError(f"{where}: [study] sampler must be one of {', '.join(SAMPLERS)}, got {study['sampler']!r}")
    _check_range(study.get("trials", 1) >= 1, where, "[study] trials", "an integer >= 1", study.get("trials"))
    if not study["name"].strip():
        raise UserError(f"{where}: [study] name must not be empty")
    for key, allowed in (("objective", OBJECTIVES), ("lr_scaling", LR_SCALINGS)):
        if key in study and study[key] not in allowed:
            raise UserError(f"{where}: [study] {key} must be one of {', '.join(allowed)}, got {study[key]!r}")
    objective = study.get("objective", "throughput")
    target = study.get("target_accuracy")
    if objective == "time-to-accuracy" and target is None:
        raise UserError(f"{where}: objective = \"time-to-accuracy\" needs [study] target_accuracy (a number between 0 and 1)")
    if target is not None:
        _check_range(0 < target <= 1, where, "[study] target_accuracy", "a number between 0 and 1", target)
    for key in ("eval_every_samples", "job_samples"):
        if key in study:
            _check_range(study[key] >= 1, where, f"[study] {key}", "an integer >= 1", study[key])
    _check_range(0 <= study.get("prune_below", 0.5) < 1, where, "[study] prune_below",
                 "a number from 0 (off) to below 1", study.get("prune_below"))
    if "warm_start" in study:
        study["warm_start"] = warm_start_names(study["warm_start"], f"{where}: [study] warm_start")
    _check_range(study.get("warm_start_top_k", 0) >= 0, where, "[study] warm_start_top_k", "an integer >= 0",
                 study.get("warm_start_top_k"))

    nproc = study.get("nproc", 1)
    _check_range(nproc == "auto" or (isinstance(nproc, int) and nproc >= 1), where, "[study] nproc",
                 "an integer >= 1 (ranks or replicas per trial) or \"auto\" (one per visible GPU)", nproc)
    if nproc != 1 and objective == "time-to-accuracy":
        raise UserError(f"{where}: objective = \"time-to-accuracy\" evaluates between windows in one process; a "
                        f"data-parallel trial (nproc = {nproc!r}) is measured for throughput or pareto")

    burst = BurstSection(**_section(raw, "burst", where))
    _check_range(burst.train_samples >= 1, where, "[burst] train_samples", "an integer >= 1", burst.train_samples)
    _check_range(0 <= burst.warmup_samples < burst.train_samples, where, "[burst] warmup_samples",
                 f"an integer >= 0 and below train_samples ({burst.train_samples})", burst.warmup_samples)
    _check_range(burst.windows >= 1, where, "[burst] windows", "an integer >= 1", burst.windows)
    _check_range(burst.timeout_s > 0, where, "[burst] timeout_s", "a number of seconds > 0", burst.timeout_s)
    _check_range(burst.min_window_seconds >= 0, where, "[burst] min_window_seconds", "a number of seconds >= 0",
                 burst.min_window_seconds)
    confirm = ConfirmSection(**_section(raw, "confirm", where))
    _check_range(confirm.top_k >= 0, where, "[confirm] top_k", "an integer >= 0", confirm.top_k)
    for key in ("repeats", "noisy_repeats"):
        _check_range(getattr(confirm, key) >= 1, where, f"[confirm] {key}", "an integer >= 1", getattr(confirm, key))
    _check_range(confirm.noise_cv > 0, where, "[confirm] noise_cv", "a number > 0", confirm.noise_cv)
    _check_range(confirm.min_speedup >= 0, where, "[confirm] min_speedup", "a number >= 0", confirm.min_speedup)
    guard = GuardSection(**_section(raw, "guard", where))
    _check_range(0 <= guard.max_accuracy_drop <= 1, where, "[guard] max_accuracy_drop",
                 "a number between 0 and 1", guard.max_accuracy_drop)
    _check_range(guard.baseline_runs >= 1, where, "[guard] baseline_runs", "an integer >= 1", guard.baseline_runs)
    _check_range(0 < guard.max_memory_fraction <= 1, where, "[guard] max_memory_fraction",
                 "a number above 0, at most 1", guard.max_memory_fraction)
    if not guard.accuracy and objective != "throughput":
        raise UserError(f"{where}: [guard] accuracy = false leaves nothing to judge objective = {objective!r} by; "
                        f"it needs objective = \"throughput\"")

    space_def = for_framework(framework)
    baseline = raw.get("baseline", {})
    space = raw.get("space", {})
    options = raw.get("workload", {})
    for name, table in (("baseline", baseline), ("space", space), ("workload", options)):
        if not isinstance(table, dict):
            raise UserError(f"{where}: [{name}] must be a table, got {_type_name(table)}")
    space = dict(space)
    effective = space.pop("effective_batch_size", None)
    if effective is not None:
        if isinstance(effective, bool) or not isinstance(effective, int) or effective < 1:
            raise UserError(f"{where}: [space] effective_batch_size must be an integer >= 1, got {effective!r}")
        if "accumulation_steps" in space or "accumulation_steps" in baseline:
            raise UserError(f"{where}: [space] effective_batch_size fixes accumulation_steps "
                            f"(= effective_batch_size / batch_size); do not set accumulation_steps too")
        base_batch = baseline.get("batch_size")
        if base_batch is not None and isinstance(base_batch, int) and base_batch > 0 and effective % base_batch:
            raise UserError(f"{where}: [space] effective_batch_size = {effective} is not a multiple of "
                            f"[baseline] batch_size = {base_batch}")
    for knob, value in baseline.items():
        problem = space_def.validate_values(knob, [value])
        if problem:
            raise UserError(f"{where}: [baseline] {problem}")
    for knob, values in space.items():
        if not isinstance(values, list) or not values:
            raise UserError(f"{where}: [space] {knob} must be a non-empty array of values, got {values!r}")
        problem = space_def.validate_values(knob, values)
        if problem:
            raise UserError(f"{where}: [space] {problem}")

    return Definition(
        study=StudySection(**study),
        burst=burst,
        guard=guard,
        baseline=dict(baseline),
        space={k: list(v) for k, v in space.items()},
        workload=dict(options),
        confirm=confirm,
        effective_batch_size=effective,
        source=source,
    )


def warm_start_names(names: list[Any], what: str) -> tuple[str, ...]:
    """Study names for a warm start (each once, in order); ``what`` names where they came from."""
    if not all(isinstance(n, str) and n.strip() for n in names):
        raise UserError(f"{what} must be study names (non-empty strings), got {names!r}")
    return tuple(dict.fromkeys(n.strip() for n in names))


def _script(study: dict[str, Any], where: str, base_dir: Path | None) -> tuple[str, tuple[str, ...]]:
    """[study] script as an absolute path (relative ones from the study file's folder), and args."""
    given = Path(study["script"]).expanduser()
    path = given if given.is_absolute() else (base_dir or Path.cwd()) / given
    if not path.is_file():
        raise UserError(f"{where}: [study] script {study['script']!r}: no such file ({path})")
    args = study.get("args", [])
    if not all(isinstance(a, (str, int, float)) and not isinstance(a, bool) for a in args):
        raise UserError(f"{where}: [study] args must be an array of strings, got {args!r}")
    return str(path.resolve()), tuple(str(a) for a in args)


def load(path: str | Path) -> Definition:
    """Read and validate the study file at ``path``."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UserError(f"study file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read study file {path}: {exc}") from None
    return parse(text, source=str(path), default_name=path.stem, base_dir=path.resolve().parent)


def from_dict(data: Mapping[str, Any]) -> Definition:
    """Rebuild a Definition from ``as_dict()`` (as stored in a study's attributes)."""
    study = dict(data["study"])
    study["args"] = tuple(study.get("args") or ())
    study["warm_start"] = tuple(study.get("warm_start") or ())
    return Definition(
        study=StudySection(**study),
        confirm=ConfirmSection(**data.get("confirm", {})),
        effective_batch_size=data.get("effective_batch_size"),
        burst=BurstSection(**data["burst"]),
        guard=GuardSection(**data["guard"]),
        baseline=dict(data.get("baseline", {})),
        space={k: list(v) for k, v in data.get("space", {}).items()},
        workload=dict(data.get("workload", {})),
    )
