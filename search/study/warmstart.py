"""Warm start from earlier studies (``[study] warm_start``, ``--warm-start``): the confirmed winners,
then the top configurations, of finished studies of the same framework in the same storage, queued
right after this study's baseline, their knobs clipped to this study's space.

Clipping: a value this study offers is kept; a number it does not offer becomes the nearest offered
number (on a tie, the smaller); any other value (a string or a boolean not offered) is dropped and
that knob is left to the sampler. Configurations equal to one already queued, measured or queued
before them are dropped. Each source is queued once per study: its name is recorded in the study
attribute ``warm_start`` and a resumed run does not queue it again."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, TextIO

import optuna
from optuna.trial import FrozenTrial

from knobtune.search.errors import UserError
from knobtune.search.storage import record
from knobtune.search.storage.record import StudyRecord, TrialRecord
from knobtune.search.story import results
from knobtune.search.story.export import study_names
from knobtune.search.study.definition import Definition
from knobtune.search.study.objective import Plan
from knobtune.spaces.knobs import Offer, Space

ATTR = "warm_start"       # study attribute: the sources already queued from
SOURCE = "warm-start"     # the queued trials' ``source``


@dataclass(frozen=True)
class Candidate:
    """One source trial's configuration, waiting to be clipped and queued."""

    study: str
    trial: int
    role: str                 # "confirmed winner", "best" (unconfirmed) or "top"
    values: dict[str, Any]    # every knob value the source trial ran with


def used_sources(storage: Any, name: str) -> list[str]:
    """The sources the study ``name`` already queued from (none when it does not exist yet)."""
    try:
        study_id = storage.get_study_id_from_name(name)
    except KeyError:
        return []
    return list((StudyRecord.from_attrs(storage.get_study_user_attrs(study_id)).warm_start or {}).get("sources", []))


def candidates(storage: Any, name: str, definition: Definition) -> list[Candidate]:
    """The configurations to queue for the study ``name``: every new source's winner first, then
    each one's ``warm_start_top_k`` best others. Raises UserError for a source that cannot be used."""
    cfg = definition.study
    used = set(used_sources(storage, name))
    sources = [s for s in cfg.warm_start if s not in used]
    ranked = [_ranked(_source(storage, source, name, cfg.framework)) for source in sources]
    return [r[0] for r in ranked] + [c for r in ranked for c in r[1:1 + cfg.warm_start_top_k]]


def _source(storage: Any, source: str, name: str, framework: str) -> optuna.Study:
    """The source study, checked: not this study, made by knobtune, the same framework, feasible trials."""
    where = f"warm start from {source!r}"
    if source == name:
        raise UserError(f"{where}: that is this study itself; expected the name of another, finished study")
    names = study_names(storage)
    if source not in names:
        others = ", ".join(n for n in names if n != name) or "none"
        raise UserError(f"{where}: no such study in this storage; expected one of its studies: {others}")
    study = optuna.load_study(study_name=source, storage=storage)
    theirs = StudyRecord.of(study).framework
    if theirs is None:
        raise UserError(f"{where}: it was not made by knobtune (no study definition); expected a knobtune study")
    if theirs != framework:
        raise UserError(f"{where}: it is a {theirs} study, this one is {framework}; expected a {framework} study")
    if not results.feasible(study):
        counts = results.outcome_counts(study)
        detail = ", ".join(f"{n} {k}" for k, n in counts.items()) or "no finished trials"
        raise UserError(f"{where}: it has no finished trial that passed its guards ({detail}); expected a study "
                        f"with at least one feasible trial")
    return study


def _ranked(study: optuna.Study) -> list[Candidate]:
    """The source's winner (confirmed when a current confirmation exists), then its other feasible
    trials from the best down, by the source's own objective."""
    winner = results.best(study)
    role = "confirmed winner" if results.confirmation(study) is not None else "best"
    if results.mode(study) == "time-to-accuracy":
        others = sorted(results.feasible(study), key=lambda t: t.value)
    else:
        others = sorted(results.feasible(study), key=results.rate, reverse=True)
    ranked = [(winner, role)] if winner is not None else []
    ranked += [(t, "top") for t in others if winner is None or t.number != winner.number]
    return [Candidate(study.study_name, t.number, r, _values(t)) for t, r in ranked]


def _values(trial: FrozenTrial) -> dict[str, Any]:
    """What the trial ran with: its applied knobs' values, its requested params over them."""
    return {**TrialRecord.of(trial).applied_knobs, **trial.params}


def nearest(value: Any, choices: list[Any]) -> Any | None:
    """``value`` if offered; else the nearest offered number (a tie: the smaller) for a number;
    else None (the knob is left to the sampler)."""
    if any(c == value and type(c) is type(value) for c in choices):  # (True is not 1 here)
        return value
    numbers = [c for c in choices if _number(c)]
    if not _number(value) or not numbers:
        return None
    return min(numbers, key=lambda c: (abs(c - value), c))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def clip(space: Space, offer: Offer, values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """``values`` as this study's Optuna params (offered, active, searched knobs), and the knobs
    changed on the way: ``{knob: [from, to]}``, ``to`` None when dropped to the sampler."""
    params: dict[str, Any] = {}
    changed: dict[str, list[Any]] = {}
    for knob in space.knobs:
        choices = offer.choices.get(knob.name)
        if not choices or knob.inactive(params) or knob.name not in values:
            continue
        value = nearest(values[knob.name], choices)
        if value is None or value != values[knob.name]:
            changed[knob.name] = [values[knob.name], value]
        if value is not None:
            params[knob.name] = value
    searched = {k: v for k, v in params.items() if len(offer.choices[k]) > 1}
    return searched, {k: v for k, v in changed.items() if len(offer.choices[k]) > 1}


def enqueue(study: optuna.Study, plan: Plan, found: list[Candidate], err: TextIO) -> int:
    """Queue ``found`` (clipped, deduplicated) and record their sources; the number queued. Once
    the study's baseline has succeeded (it goes first); a recorded source is never queued again."""
    base = results.baseline(study)
    used = (StudyRecord.of(study).warm_start or {}).get("sources", [])
    fresh = [c for c in found if c.study not in used]
    if not fresh or base is None or not TrialRecord.of(base).ok:
        return 0
    known, queued = results.configurations(study), 0
    for c in fresh:
        params, changed = clip(plan.space, plan.offer, c.values)
        if params in known:
            continue
        known.append(params)
        origin: dict[str, Any] = {"study": c.study, "trial": c.trial, "role": c.role}
        if changed:
            origin["clipped"] = changed
        study.enqueue_trial(params, user_attrs=record.queued(source=SOURCE, warm_start_from=origin))
        queued += 1
    sources = list(dict.fromkeys([*used, *(c.study for c in fresh)]))
    record.mark_study(study, warm_start={"sources": sources})
    err.write(f"knobtune: warm start: {queued} configuration(s) queued from {', '.join(dict.fromkeys(c.study for c in fresh))} "
              f"({len(fresh) - queued} duplicate(s) dropped)\n")
    return queued
