"""Knob and Space: what can be searched, where it applies, how a trial suggests it, which call
of the child applies it, how the child checks its value, and its lines in the export snippet.

A knob that cannot apply on this hardware or to this workload is not offered; a knob that is
inactive for the other values of a trial (``prefetch_factor`` without workers) is not suggested.
Either way it keeps its framework default and the trial's ``knobs`` attribute says why.
Choice lists are fixed per study, as Optuna requires.

The engine imports this module and the frameworks' spaces, which never import a framework:
what touches torch or TensorFlow (applying a knob that acts on its own, reading every knob back)
is the knob's ``Handling`` in ``trainers/<framework>/knobs.py`` (trainers/common/handling.py),
under the same name.
"""
from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Iterator, Mapping, Protocol, Sequence

Context = Mapping[str, Any]  # {"hardware": {...}, "workload": {...}} as the probe reported them


@dataclass(frozen=True)
class Lines:
    """A knob's lines in the export snippet: ``env``, set in ``os.environ`` before the framework
    starts; ``code``, placed by the framework's script (statements, or a call's arguments)."""

    env: tuple[str, ...] = ()
    code: tuple[str, ...] = ()


class Suggester(Protocol):
    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any: ...


@dataclass(frozen=True)
class Knob:
    """One searchable setting.

    ``choices(ctx)`` gives the default choice list on this hardware (the framework default is
    always among them); ``unavailable(ctx)`` says why the knob does not apply here (None when it
    does); ``inactive(values)`` says why it does not apply given the other knobs' values.
    ``check(value)`` returns an error text for an impossible value, or None.

    In the child: ``applied_by`` is the Tuned call that applies the knob ("load": ``Tuned`` itself,
    process-wide, through the knob's ``Handling`` in trainers/<framework>/knobs.py; any other call
    applies it with the others it builds one object from: the DataLoader, the model, the
    optimizer, the tf.data pipeline, ``model.compile``). ``lines(value)`` is its lines in the
    export snippet. ``problem(value, knobs, hardware)``,
    in a trial's child or in production, says why this machine (``hardware``: the facts the
    framework's ``env.hardware()`` reports for the process's own device) cannot apply ``value``
    given the other ``knobs``; ``check`` has already passed.
    """

    name: str
    kind: type
    default: Any
    help: str
    choices: Callable[[Context], list[Any]]
    unavailable: Callable[[Context], str | None] = lambda ctx: None
    inactive: Callable[[Mapping[str, Any]], str | None] = lambda values: None
    check: Callable[[Any], str | None] = lambda value: None
    value_unavailable: Callable[[Any, Context], str | None] = lambda value, ctx: None
    default_in: Callable[[Context], Any] | None = None  # a framework default that depends on hardware
    applied_by: str = "load"
    lines: Callable[[Any], Lines] = lambda value: Lines()
    problem: Callable[[Any, Mapping[str, Any], Mapping[str, Any]], str | None] | None = None

    def default_for(self, ctx: Context) -> Any:
        return self.default_in(ctx) if self.default_in else self.default

    def type_error(self, value: Any) -> str | None:
        """None when ``value`` has the knob's type (bool is not an int here)."""
        if self.kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            return f"expected an integer, got {value!r}"
        if self.kind is bool and not isinstance(value, bool):
            return f"expected true or false, got {value!r}"
        if self.kind is str and not isinstance(value, str):
            return f"expected a string, got {value!r}"
        if self.kind is object and not isinstance(value, (bool, int, float, str)):
            return f"expected a number or a string, got {value!r}"
        return self.check(value)


@dataclass(frozen=True)
class Resolved:
    """A knob's value for one trial, and whether it applied."""

    value: Any
    applied: bool
    why: str | None = None

    def as_attr(self) -> dict[str, Any]:
        out: dict[str, Any] = {"value": self.value, "applied": self.applied}
        if self.why:
            out["why"] = self.why
        return out


@dataclass(frozen=True)
class Offer:
    """The choices a study searches, after hardware, workload and the study file's narrowing."""

    choices: dict[str, list[Any]]
    unavailable: dict[str, str]  # knob -> why it is not offered here
    dropped: dict[str, list[str]] = field(default_factory=dict)  # knob -> notes on values dropped
    effective_batch: int | None = None  # batch_size x accumulation_steps fixed; accumulation derived

    def derived(self, name: str, values: Mapping[str, Any]) -> Any:
        """The value of a knob derived from others (accumulation_steps under a fixed effective
        batch), or None when ``name`` is searched as usual."""
        if name == "accumulation_steps" and self.effective_batch and "batch_size" in values:
            return self.effective_batch // values["batch_size"]
        return None


@dataclass(frozen=True)
class Space:
    """A framework's knobs, in suggestion order (a knob's conditions may read earlier ones).

    ``advice(ctx)`` is the seeds' hand-tuning advice for this hardware, as knob values: the
    study's second trial, so the search starts from what an expert would try first.
    """

    framework: str
    knobs: tuple[Knob, ...]
    advice: Callable[[Context], dict[str, Any]] = lambda ctx: {}
    # the most parallel input-pipeline settings on this hardware (for the input ceiling)
    input_variants: Callable[[Context], dict[str, dict[str, Any]]] = lambda ctx: {}
    # why a combination of values cannot train correctly on this hardware (None: it can)
    invalid: Callable[[Mapping[str, Any], Context], str | None] = lambda values, ctx: None
    # the export snippet: the framework's training script around the knobs' lines
    script: Callable[[Shown], str] = lambda shown: ""
    # the export snippet of a trainer library's script (its arguments), by the integration's name
    integrations: Mapping[str, Callable[[Shown], str]] = field(default_factory=dict)
    # the knobs that change what is learnt (the batch a gradient averages, the arithmetic's
    # precision, which samples share a batch), not only how fast: confirmation hedges over them
    learning_knobs: tuple[str, ...] = ()

    @property
    def names(self) -> list[str]:
        return [k.name for k in self.knobs]

    def knob(self, name: str) -> Knob:
        for k in self.knobs:
            if k.name == name:
                return k
        raise KeyError(name)

    def applied_by(self, call: str) -> tuple[str, ...]:
        """The knobs the Tuned call ``call`` applies, in declaration order."""
        return tuple(k.name for k in self.knobs if k.applied_by == call)

    def validate_values(self, name: str, values: Sequence[Any]) -> str | None:
        """Static check of one ``[space]`` or ``[baseline]`` entry; an error text or None."""
        if name not in self.names:
            return f"unknown {self.framework} knob {name!r}; allowed: {', '.join(self.names)}"
        knob = self.knob(name)
        for value in values:
            problem = knob.type_error(value)
            if problem:
                return f"{name}: {problem}"
        return None

    def defaults(self, ctx: Context, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The framework defaults (the workload's own batch size; a script's own loader
        settings), then ``overrides``."""
        values = {k.name: k.default_for(ctx) for k in self.knobs}
        workload = ctx.get("workload", {})
        if workload.get("batch_size"):
            values["batch_size"] = workload["batch_size"]
        values.update({k: v for k, v in (workload.get("settings") or {}).items() if k in values})
        values.update(overrides or {})
        return values

    def offer(self, ctx: Context, narrowing: Mapping[str, Sequence[Any]], baseline: Mapping[str, Any],
              effective_batch: int | None = None) -> Offer:
        """Choice lists for this hardware and workload; the baseline's values are always offered.

        With ``effective_batch`` only batch sizes dividing it are offered, and accumulation_steps
        is derived (effective_batch / batch_size) instead of searched. Raises ValueError when the
        baseline's batch size does not divide it.
        """
        choices: dict[str, list[Any]] = {}
        unavailable: dict[str, str] = {}
        dropped: dict[str, list[str]] = {}
        base_values = self.defaults(ctx, baseline)
        if effective_batch and effective_batch % base_values["batch_size"]:
            raise ValueError(f"[space] effective_batch_size = {effective_batch} is not a multiple of the baseline's "
                             f"batch_size = {base_values['batch_size']}")
        for knob in self.knobs:
            if effective_batch and knob.name == "accumulation_steps":
                continue
            why = knob.unavailable(ctx)
            if why:
                unavailable[knob.name] = why
                continue
            wanted = list(narrowing[knob.name]) if knob.name in narrowing else knob.choices(ctx)
            kept = []
            for value in wanted:
                problem = knob.value_unavailable(value, ctx)
                if problem:
                    dropped.setdefault(knob.name, []).append(f"{value!r}: {problem}")
                elif value not in kept:
                    kept.append(value)
            base = base_values[knob.name]
            if base not in kept and knob.value_unavailable(base, ctx) is None:
                kept.append(base)
            if effective_batch and knob.name == "batch_size":
                for value in [v for v in kept if effective_batch % v]:
                    dropped.setdefault(knob.name, []).append(f"{value!r}: does not divide effective_batch_size")
                kept = [v for v in kept if effective_batch % v == 0]
            if knob.kind in (int, float):
                kept.sort()
            elif knob.kind is object:  # numbers first, in order, then the named values
                kept.sort(key=lambda v: (isinstance(v, str), v if not isinstance(v, str) else 0, str(v)))
            choices[knob.name] = kept
        return Offer(choices, unavailable, dropped, effective_batch)

    def suggest(self, trial: Suggester, offer: Offer) -> dict[str, Any]:
        """Ask ``trial`` for each offered, active knob, in declaration order."""
        values: dict[str, Any] = {}
        for knob in self.knobs:
            if knob.name not in offer.choices or knob.inactive(values):
                continue
            options = offer.choices[knob.name]
            values[knob.name] = options[0] if len(options) == 1 else trial.suggest_categorical(knob.name, options)
        return values

    def resolve(self, suggested: Mapping[str, Any], offer: Offer, ctx: Context,
                baseline: Mapping[str, Any] | None = None) -> dict[str, Resolved]:
        """Every knob's value for a trial: suggested, or the default with the reason it did not apply."""
        defaults = self.defaults(ctx, baseline)
        resolved: dict[str, Resolved] = {}
        values: dict[str, Any] = {}
        for knob in self.knobs:
            if knob.name in offer.unavailable:
                resolved[knob.name] = Resolved(knob.default_for(ctx), False, offer.unavailable[knob.name])
                continue
            derived = offer.derived(knob.name, values)
            if derived is not None:
                values[knob.name] = derived
                resolved[knob.name] = Resolved(derived, True, "effective_batch_size / batch_size")
                continue
            options = offer.choices.get(knob.name, ())
            # a knob narrowed to one choice is never asked of the sampler, so it is not in a
            # trial's params: that choice, not the framework default, is what the trial ran with
            value = suggested.get(knob.name, options[0] if len(options) == 1 else defaults[knob.name])
            why = knob.inactive(values)
            if why:
                resolved[knob.name] = Resolved(knob.default_for(ctx), False, why)
                continue
            values[knob.name] = value
            resolved[knob.name] = Resolved(value, True)
        return resolved

    def params_for(self, offer: Offer, values: Mapping[str, Any]) -> dict[str, Any]:
        """``values`` as Optuna params for enqueue_trial: the offered, active, searched knobs only."""
        params: dict[str, Any] = {}
        for knob in self.knobs:
            if knob.name in offer.choices and not knob.inactive(params):
                value = values.get(knob.name, knob.default)
                if value not in offer.choices[knob.name]:
                    value = knob.default if knob.default in offer.choices[knob.name] else offer.choices[knob.name][0]
                params[knob.name] = value
        return {k: v for k, v in params.items() if len(offer.choices[k]) > 1}

    def baseline_params(self, offer: Offer, ctx: Context, baseline: Mapping[str, Any]) -> dict[str, Any]:
        """The baseline (framework defaults, then the study's [baseline]) as Optuna params."""
        return self.params_for(offer, self.defaults(ctx, baseline))

    def problems(self, values: Mapping[str, Any], hardware: Mapping[str, Any]) -> dict[str, str]:
        """In a trial's child or in production: knob -> why this machine cannot apply its value in
        ``values`` (a value the knob does not take, or one this device lacks), for the knobs given."""
        out: dict[str, str] = {}
        for knob in self.knobs:
            if knob.name not in values:
                continue
            value = values[knob.name]
            wrong = knob.type_error(value)
            why = f"{knob.name}={value!r}: {wrong}" if wrong else (
                knob.problem(value, values, hardware) if knob.problem else None)
            if why:
                out[knob.name] = why
        return out

    def advice_params(self, offer: Offer, ctx: Context, baseline: Mapping[str, Any]) -> dict[str, Any]:
        """The seeds' advice applied on top of the baseline, as Optuna params."""
        return self.params_for(offer, {**self.defaults(ctx, baseline), **self.advice(ctx)})

    def random_params(self, offer: Offer, rng: random.Random) -> dict[str, Any]:
        """One configuration drawn uniformly, knob by knob (conditions respected), as Optuna params."""
        values: dict[str, Any] = {}
        for knob in self.knobs:
            if knob.name in offer.choices and not knob.inactive(values):
                values[knob.name] = rng.choice(offer.choices[knob.name])
        return {k: v for k, v in values.items() if len(offer.choices[k]) > 1}

    def grid(self, offer: Offer) -> Iterator[dict[str, Any]]:
        """Every distinct active combination of the offered choices (for exhaustive benchmarks)."""
        seen: set[tuple[tuple[str, Any], ...]] = set()
        names = list(offer.choices)
        for combo in itertools.product(*(offer.choices[n] for n in names)):
            values: dict[str, Any] = {}
            for knob in self.knobs:
                if knob.name in offer.choices and not knob.inactive(values):
                    values[knob.name] = combo[names.index(knob.name)]
            key = tuple(sorted(values.items()))
            if key not in seen:
                seen.add(key)
                yield values


@dataclass(frozen=True)
class Shown:
    """What an export snippet shows: the winner's ``knobs``, less those ``skipped`` (not applied
    when measured); ``learning_rate(setter)`` is the lines setting the rescaled learning rate
    (none when it was not rescaled), ``setter`` the framework's statement with ``{lr}`` in it."""

    space: Space
    knobs: Mapping[str, Any]
    skipped: Collection[str]
    learning_rate: Callable[[str], list[str]]
    cuda: bool = False  # measured on a CUDA device (a library's fields differ there)
    nproc: int = 1  # measured as a data-parallel group of this many ranks or replicas

    def on(self, name: str) -> bool:
        return name in self.knobs and name not in self.skipped

    def value(self, name: str, default: Any) -> Any:
        """The knob's value when shown, else ``default`` (the framework's own)."""
        return self.knobs.get(name, default) if self.on(name) else default

    def lines(self, *names: str) -> Lines:
        """The lines of the shown knobs among ``names``, in that order."""
        env: list[str] = []
        code: list[str] = []
        for name in names:
            if self.on(name):
                lines = self.space.knob(name).lines(self.knobs[name])
                env += lines.env
                code += lines.code
        return Lines(tuple(env), tuple(code))

    @staticmethod
    def source(env: Sequence[str], body: list[str]) -> str:
        """The script: the environment knobs' lines first (before the framework is imported)."""
        return "\n".join([*(["import os", *env] if env else []), *body]) + "\n"


# Helpers both frameworks' spaces build their knobs from.

def hardware(ctx: Context) -> Mapping[str, Any]:
    return ctx.get("hardware", {})


def usable_cores(ctx: Context) -> int:
    return int(hardware(ctx).get("usable_cores", 1))


def positive(value: Any) -> str | None:
    return None if value >= 1 else f"must be >= 1, got {value}"


def one_of(*allowed: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if value in allowed else f"expected one of {', '.join(map(repr, allowed))}, got {value!r}"

    return check


def core_counts(ctx: Context, start: int = 0) -> list[int]:
    """start, 1, 2, 4, 8, ... up to the usable cores, and the usable cores themselves."""
    cores = usable_cores(ctx)
    return sorted({start, 1, cores, *[n for n in (2, 4, 8, 16, 32) if n <= cores]})


def fits_cores(what: str) -> Callable[[Any, Context], str | None]:
    def check(value: Any, ctx: Context) -> str | None:
        cores = usable_cores(ctx)
        return None if value <= cores else f"more {what} than the {cores} cores this process may use"

    return check


# ``child``: the knob's applied_by, environ, apply, read and lines in that framework

def batch_size_knob(**child: Any) -> Knob:
    return Knob("batch_size", int, 64, "samples per micro-batch",
                choices=lambda ctx: [32, 64, 128, 256, 512], check=positive, **child)


def accumulation_knob(how: str, **child: Any) -> Knob:
    return Knob("accumulation_steps", int, 1,
                f"micro-batches per optimizer step (effective batch = batch_size x accumulation_steps; {how})",
                choices=lambda ctx: [1, 2, 4], check=positive, **child)


def threads_knob(how: str, default_name: str, **child: Any) -> Knob:
    return Knob("intra_op_threads", int, 0, f"{how} (0 = {default_name}'s default)",
                choices=core_counts, value_unavailable=fits_cores("threads"),
                check=lambda v: None if v >= 0 else f"must be >= 0 (0 = {default_name}'s default), got {v}", **child)
