"""A model of per-knob effects, and the sampler built on it (``[study] sampler = "effects"``).

System knobs act nearly independently: going from no prefetch to AUTOTUNE speeds a tf.data
pipeline up by about the same factor whatever the batch size. So the model is additive in log
space: log(objective) = mean + one effect per knob value + one term per configuration measured
(what its own measurements say beyond the sum of its values' effects) + noise, fitted by ridge
least squares over every finished trial. A measurement of one configuration then teaches the
effect of each of its values, which is what lets a few trials in a space of hundreds find the
best: TPE learns the same from many more trials.

- ``Effects``: the fit; ``estimate`` a configuration's log objective (measured or not).
- ``observations``: a study's finished trials as (params, log objective); a trial that failed
  or was stopped early counts as half as good as the worst measured, and so does one that broke
  the accuracy guard unless the sampler has its accuracy model (then its measured rate counts,
  and that model keeps proposals above the floor); an invalid one (a combination that cannot run
  here) not at all: the sampler avoids the pairs of values it blames for it instead, and never
  proposes what the study knows cannot run (``invalid``).
- ``EffectsSampler``: each value is worth its effect plus a bonus for values tried least
  (bonus / sqrt(1 + trials with that value)). In a space small enough to enumerate, each trial
  takes every knob at its most valuable value; when that configuration has been measured, or is
  being measured, the most valuable one that has not. In a larger space (the full space of a
  framework: 10 to 16 knobs, 10^4 to 10^8 configurations) that rule changes every
  value not yet tried at once, and one slow value among them hides the others; there, each trial
  starts from the incumbent (the configuration that ran with the best estimate) and makes only
  its ``radius`` most valuable changes, a trust region that grows after a trial that beats every
  earlier one and shrinks after one that does not (an invalid one included). A conditional knob
  that a change switches on takes its most valuable value without counting as a change. When that
  proposal was measured, is expected under the accuracy floor or carries a clash's blame, the
  best fresh one of the incumbent's subsets of its most valuable changes and its neighbours.
  With the final verdict's accuracy floor, a second model (of accuracy, from ``accuracies``)
  steers it away from configurations expected under the floor. Multi-objective (``pareto``)
  studies get TPE: one log-rate model does not rank a front.
"""
from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

ABSENT = "(not suggested)"  # a conditional knob a trial did not have (prefetch_factor without workers)
KNOB_PENALTY = 0.3  # ridge penalty on a knob value's effect (log units)
CONFIG_PENALTY = 1.0  # on a configuration's own term: its measurements must outweigh the model's sum
ACCURACY_PENALTY = 0.05  # accuracy moves little with noise and much with a few knobs (batch size)
FAILED_FACTOR = 0.5  # a failed or infeasible trial counts as this x the worst measured objective
ENUMERATED = 4096  # a space this small is searched whole for the best unmeasured proposal
INVALID = "invalid"  # a trial's outcome when its combination cannot run here (a burst too short for it, ...)
CLASH_PENALTY = 1.0  # a proposal's cost per unit of blame for invalid trials it shares pairs of values with
RADIUS = 5  # a large space's first proposals change at most this many of the incumbent's values
MIN_RADIUS = 2  # ... and never fewer: one value at a time spends a short study on a few knobs
LOCAL_MOVES = 8  # a large space's alternatives when the best proposal is taken: subsets of this many changes

Params = dict[str, Any]


def _key(value: Any) -> Any:
    """A hashable stand-in for a knob value (choices are JSON scalars; lists would not hash)."""
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)


def config_key(params: Params) -> tuple:
    return tuple(sorted((k, _key(v)) for k, v in params.items()))


@dataclass
class Effects:
    """The fitted model: an intercept, one effect per (knob, value), one term per configuration."""

    mean: float
    effects: dict[tuple[str, Any], float]
    terms: dict[tuple, float]
    counts: dict[tuple[str, Any], int]
    knobs: list[str]

    @classmethod
    def fit(cls, observations: Sequence[tuple[Params, float]], knob_penalty: float = KNOB_PENALTY) -> Effects:
        """Ridge least squares over (params, log objective) pairs (at least one)."""
        knobs = sorted({k for p, _ in observations for k in p})
        rows = [{k: _key(p.get(k, ABSENT)) for k in knobs} for p, _ in observations]
        columns = sorted({(k, v) for r in rows for k, v in r.items()}, key=repr)
        configs = sorted({config_key(p) for p, _ in observations}, key=repr)
        col = {c: i for i, c in enumerate(columns)}
        cfg = {c: len(columns) + i for i, c in enumerate(configs)}
        x = np.zeros((len(rows), len(columns) + len(configs)))
        for i, ((params, _), row) in enumerate(zip(observations, rows)):
            for k, v in row.items():
                x[i, col[(k, v)]] = 1.0
            x[i, cfg[config_key(params)]] = 1.0
        y = np.array([v for _, v in observations], dtype=float)
        mean = float(y.mean())
        penalty = np.diag([knob_penalty] * len(columns) + [CONFIG_PENALTY] * len(configs))
        coef = np.linalg.solve(x.T @ x + penalty, x.T @ (y - mean))
        counts = {c: int(x[:, i].sum()) for c, i in col.items()}
        return cls(mean, {c: float(coef[i]) for c, i in col.items()},
                   {c: float(coef[i]) for c, i in cfg.items()}, counts, knobs)

    def effect(self, knob: str, value: Any) -> float:
        """A value's effect (0 for a value never tried: the model knows nothing of it)."""
        return self.effects.get((knob, _key(value)), 0.0)

    def count(self, knob: str, value: Any) -> int:
        return self.counts.get((knob, _key(value)), 0)

    def estimate(self, params: Params) -> float:
        """The log objective the model expects of ``params`` (its own term included when measured)."""
        knob_part = sum(self.effect(k, params.get(k, ABSENT)) for k in self.knobs)
        return self.mean + knob_part + self.terms.get(config_key(params), 0.0)


def _log_objective(trial: FrozenTrial, minimize: bool, inaccurate: bool = False) -> float | None:
    """A feasible trial's log objective (negated when smaller is better); None when it failed, broke
    a constraint (with ``inaccurate``, one that broke only the accuracy guard counts: its speed
    was measured) or was stopped early."""
    if trial.state != TrialState.COMPLETE or trial.values is None or len(trial.values) != 1:
        return None
    broken = {name for name, c in trial.constraints.items() if c > 0} - ({"accuracy"} if inaccurate else set())
    if broken or not trial.values[0] or trial.values[0] <= 0:
        return None
    value = math.log(trial.values[0])
    return -value if minimize else value


def accuracies(trials: Sequence[FrozenTrial]) -> list[tuple[Params, float]]:
    """Every finished trial's held-out accuracy, where it measured one (``val_accuracy``)."""
    return [(dict(t.params), float(t.user_attrs["val_accuracy"])) for t in trials
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
            and isinstance(t.user_attrs.get("val_accuracy"), (int, float))]


def observations(trials: Sequence[FrozenTrial], minimize: bool = False,
                 inaccurate: bool = False) -> list[tuple[Params, float]]:
    """Every finished trial that measured something (COMPLETE or PRUNED; a FAIL is a skipped
    duplicate or an interrupted run, which measured nothing; an invalid one could not run), with
    its log objective; a failed, infeasible or pruned one gets ``FAILED_FACTOR`` x the worst
    feasible objective measured. With ``inaccurate`` (the caller keeps proposals above the
    accuracy floor by a model of its own), a trial that broke only the accuracy guard counts with
    the objective it measured."""
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED) and not _invalid(t)]
    return with_failures([(dict(t.params), _log_objective(t, minimize, inaccurate)) for t in finished])


def _invalid(trial: FrozenTrial) -> bool:
    return trial.user_attrs.get("outcome") == INVALID


def radius(values: Sequence[float], startup: int, knobs: int) -> int:
    """The trust region's radius after these log objectives (in trial order, the first ``startup``
    not the sampler's): ``RADIUS``, doubled (up to ``knobs``) by a trial that beat every earlier
    one, one less (down to ``MIN_RADIUS``) by one that did not."""
    size, top = RADIUS, max(values[:startup], default=-math.inf)
    for value in values[startup:]:
        if value > top:
            size, top = min(knobs, 2 * size), value
        else:
            size = max(MIN_RADIUS, size - 1)
    return max(1, min(size, knobs))


def _in_order(trials: Sequence[FrozenTrial], seen: Sequence[tuple[Params, float]]) -> list[float]:
    """The log objectives of ``seen`` (``observations(trials)``) in trial order, with minus infinity
    for each invalid trial where it ran: for ``radius``, an invalid trial did not beat the others."""
    values = iter(v for _, v in seen)
    return [-math.inf if _invalid(t) else next(values) for t in trials
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]


def with_failures(values: Sequence[tuple[Params, float | None]]) -> list[tuple[Params, float]]:
    """(params, log objective or None for a failure): each failure at ``FAILED_FACTOR`` x the worst
    value measured; nothing while no value is known."""
    good = [v for _, v in values if v is not None]
    if not good:
        return []
    low = min(good) + math.log(FAILED_FACTOR)
    return [(p, low if v is None else v) for p, v in values]


class EffectsSampler(optuna.samplers.BaseSampler):
    """The per-knob effects model's proposals (see the module's docstring); categorical knobs only.
    The first ``n_startup_trials`` finished trials, and any knob the study has not seen before,
    are drawn at random; ``tpe`` samples multi-objective studies. ``floor`` gives the accuracy the
    final verdict will ask for (None while unknown): a second model, of the knobs' effects on
    accuracy, then steers proposals away from configurations it expects under it (a large batch
    that passes the search's allowance for noise but not the verdict). ``invalid`` tells a
    configuration the study knows cannot run here (a burst too short for its batch and steps per
    call): it is not proposed while a runnable one is left."""

    def __init__(self, seed: int | None = None, n_startup_trials: int = 2, bonus: float = 0.5,
                 tpe: optuna.samplers.TPESampler | None = None,
                 floor: Callable[[Sequence[FrozenTrial]], float | None] | None = None,
                 invalid: Callable[[Params], bool] | None = None) -> None:
        self._floor = floor
        self._invalid = invalid
        self._rng = random.Random(seed)
        self._random = optuna.samplers.RandomSampler(seed=seed)
        self._tpe = tpe or optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True)
        self._startup = n_startup_trials
        self._bonus = bonus
        self._plans: dict[int, Params | None] = {}

    def reseed_rng(self) -> None:
        self._random.reseed_rng()
        self._tpe.reseed_rng()
        self._rng = random.Random()

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        if len(study.directions) > 1:
            return self._tpe.infer_relative_search_space(study, trial)
        return {}

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if len(study.directions) > 1:
            return self._tpe.sample_relative(study, trial, search_space)
        return {}

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        if len(study.directions) > 1:
            return self._tpe.sample_independent(study, trial, param_name, param_distribution)
        if trial.number not in self._plans:
            self._plans[trial.number] = self._plan(study, trial)
        plan = self._plans[trial.number]
        if (plan is not None and param_name in plan and isinstance(param_distribution, CategoricalDistribution)
                and _key(plan[param_name]) in {_key(c) for c in param_distribution.choices}):
            return plan[param_name]
        return self._random.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self._plans.pop(trial.number, None)
        if len(study.directions) > 1:
            self._tpe.after_trial(study, trial, state, values)

    def _random_unmeasured(self, choices: dict[str, list[Any]], measured: Callable[[Params], bool],
                           tries: int = 200) -> Params | None:
        """A configuration drawn at random, not ``measured`` and not refused by ``invalid`` (None:
        none found)."""
        assert self._invalid is not None
        for _ in range(tries):
            params = {k: self._rng.choice(vs) for k, vs in choices.items()}
            if not measured(params) and not self._invalid(params):
                return params
        return None

    def _plan(self, study: optuna.Study, trial: FrozenTrial) -> Params | None:
        """Every known knob's value for this trial, or None while the study is starting."""
        trials = study.get_trials(deepcopy=False)
        minimize = study.direction == optuna.study.StudyDirection.MINIMIZE
        floor = self._floor(trials) if self._floor is not None else None
        known = accuracies(trials)
        accuracy = Effects.fit(known, ACCURACY_PENALTY) if floor is not None and len(known) >= self._startup else None
        # With the accuracy model to keep proposals above the floor, a trial that broke only the
        # accuracy guard still says how fast its values are: counted as a failure, a fast batch 512
        # under the floor taught the rate model that the workers and threads it ran with were slow.
        seen = observations(trials, minimize, inaccurate=accuracy is not None)
        choices: dict[str, list[Any]] = {}
        for t in trials:  # every knob's choices, from the distributions the study has suggested
            for name, dist in t.distributions.items():
                if isinstance(dist, CategoricalDistribution) and name not in choices:
                    choices[name] = list(dist.choices)
        # measured or being measured (this run's or another worker's): not proposed again. A trial
        # lacks the conditional knobs it did not suggest, so each is compared on its own knobs.
        taken = [dict(t.params) for t in trials if t.number != trial.number
                 and t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)]
        taken += [dict(t.system_attrs.get("fixed_params", {})) for t in trials
                  if t.number != trial.number and t.state == TrialState.WAITING]
        by_knobs: dict[tuple[str, ...], set[tuple]] = {}
        for p in taken:
            if p:
                names = tuple(sorted(p))
                by_knobs.setdefault(names, set()).add(tuple(_key(p[k]) for k in names))

        def measured(params: Params) -> bool:
            return any(tuple(_key(params.get(k)) for k in names) in values for names, values in by_knobs.items())

        if len(seen) < self._startup:  # drawn at random, but neither measured nor known not to run
            return self._random_unmeasured(choices, measured) if self._invalid is not None and choices else None
        model = Effects.fit(seen)

        # A combination that could not run says nothing of its values' speed (the model leaves it
        # out), only that some of them do not go together. Most such clashes are of two values
        # (a batch too large for several steps per call), so an invalid trial's blame is shared
        # among the pairs of values it changed from the first trial (the baseline) that no trial
        # which ran had; a proposal pays CLASH_PENALTY (log units) per unit of blame it carries.
        first = min((t for t in trials if t.state == TrialState.COMPLETE), key=lambda t: t.number, default=None)
        origin = {k: _key(v) for k, v in (first.params if first is not None else {}).items()}

        def pairs(params: Params, alone: bool = True) -> set[frozenset]:
            """The changed values' pairs (and each alone: with ``alone``, or when it is the only change)."""
            changed = sorted(((k, _key(v)) for k, v in params.items() if origin.get(k, ABSENT) != _key(v)), key=repr)
            single = {frozenset([c]) for c in changed} if alone or len(changed) == 1 else set()
            return {frozenset(pair) for pair in itertools.combinations(changed, 2)} | single

        ran = set().union(*(pairs(p) for p, _ in seen))  # (``seen``: every trial that ran)
        blame: dict[frozenset, float] = {}
        for t in trials:
            if _invalid(t):
                unexplained = pairs(t.params, alone=False) - ran
                for pair in unexplained:
                    blame[pair] = blame.get(pair, 0.0) + 1 / len(unexplained)

        def clash(params: Params) -> float:
            return CLASH_PENALTY * sum(blame.get(pair, 0.0) for pair in pairs(params)) if blame else 0.0

        value = {(k, _key(v)): model.effect(k, v) + self._bonus / math.sqrt(1 + model.count(k, v))
                 + self._rng.uniform(0, 1e-9)  # (ties broken at random)
                 for k, vs in choices.items() for v in vs}

        def score(params: Params) -> float:
            return sum(value[(k, _key(v))] for k, v in params.items()) - clash(params)

        def allowed(params: Params) -> bool:
            return accuracy is None or accuracy.estimate(params) >= floor

        best = {k: max(vs, key=lambda v, k=k: value[(k, _key(v))]) for k, vs in choices.items()}
        if math.prod(len(vs) for vs in choices.values()) <= ENUMERATED:
            first_choice = best
            near = [dict(zip(choices, values)) for values in itertools.product(*choices.values())]
        else:  # a large space: the incumbent's most valuable changes, within the trust region
            feasible = [dict(t.params) for t in trials if _log_objective(t, minimize) is not None]
            incumbent = max([p for p in feasible if allowed(p)] or feasible or [best], key=model.estimate)
            # a conditional knob the incumbent lacks takes its most valuable value (not a change)
            incumbent = {k: incumbent[k] if (k, _key(incumbent.get(k, ABSENT))) in value else best[k] for k in choices}
            alternative = {k: max((v for v in vs if _key(v) != _key(incumbent[k])),
                                  key=lambda v, k=k: value[(k, _key(v))], default=ABSENT) for k, vs in choices.items()}
            moves = sorted(((value[(k, _key(v))] - value[(k, _key(incumbent[k]))], k, v)
                            for k, v in alternative.items() if v is not ABSENT), key=lambda m: -m[0])
            # (a trial under the accuracy floor is no new best, however fast it ran)
            size = radius(_in_order(trials, observations(trials, minimize)), self._startup, len(choices))
            first_choice = {**incumbent, **{k: v for g, k, v in moves[:size] if g > 0}}
            near = [{**incumbent, **{k: v for _, k, v in chosen}} for n in range(2, size + 1)
                    for chosen in itertools.combinations(moves[:LOCAL_MOVES], n)]
            near += [{**incumbent, k: v} for k, vs in choices.items() for v in vs if _key(v) != _key(incumbent[k])]

        def runnable(params: Params) -> bool:
            return self._invalid is None or not self._invalid(params)

        if not measured(first_choice) and allowed(first_choice) and not clash(first_choice) and runnable(first_choice):
            return first_choice
        fresh = sorted((p for p in [first_choice, *near] if not measured(p)), key=lambda p: (allowed(p), score(p)),
                       reverse=True)
        if not fresh:  # all measured: the queue's duplicate rule explores from here
            return first_choice
        return next((p for p in fresh if runnable(p)), fresh[0])


__all__ = ["ABSENT", "Effects", "EffectsSampler", "accuracies", "config_key", "observations", "radius",
           "with_failures"]
