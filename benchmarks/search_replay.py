"""Search strategies replayed on a measured grid: many seeds in seconds, to choose what to try in
the real benchmark (benchmarks/search_quality.py), never to replace it.

The grid file is search_quality.py's (--grid-file): every configuration of a small space measured
in several passes on this machine, pass p with seed p. A replayed study has a seed (one pass): a
trial of a configuration takes its rate from one of its passes at random (the machine's own noise,
as measured) and its accuracy from the study's pass (a study runs every trial with its seed, so
they share that seed's luck); a configuration whose passes all failed fails. Each strategy has the
same trial budget; its pick is then re-measured as
knobtune's confirmation does (the top candidates and the baseline in --rounds rounds, each round
one pass of the grid drawn at random, in which all of them take that pass's measurement, as a real
round measures them all within a minute; knobtune's winner rule, confirm.choose_winner: a candidate
must be 3 % faster than the baseline in the median paired ratio, and faster in most rounds, or the
baseline is kept; among several, the fastest against the others) and scored by
the grid's reference, as search_quality.py scores it (the top's paired rounds, and its best chosen
on half of them and measured on the other half). The accuracy floors are knobtune's, from
its baseline's two seeds (two passes drawn for each replayed study): the search's guard, with
their spread as its allowance for noise, and the verdict's, without it; confirmation's candidates
are those the search's guard passed, the ones expected at the verdict's floor first (by their own
trial's accuracy, or by the accuracy model pooled over every trial), the line-up hedged or not over
the space's learning knobs (confirm.line_up; ``--only`` picks the strategies). What
this leaves out: pruning and the real study's duplicate handling.

    .venv/bin/python benchmarks/search_replay.py GRID.json [--trials 10] [--seeds 200]
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from knobtune.search.study.effects import ACCURACY_PENALTY, Effects, EffectsSampler, with_failures  # noqa: E402
from knobtune.search.study.confirm import choose_winner, line_up  # noqa: E402
from knobtune.search.study.definition import ConfirmSection, GuardSection  # noqa: E402
from knobtune.search.study.objective import accuracy_floor, final_floor  # noqa: E402
from knobtune.spaces import for_framework  # noqa: E402

from _bench import grid_baseline, grid_runs, grid_table, reference_spread, settled, split_best  # noqa: E402

Config = tuple[tuple[str, Any], ...]
Runs = dict[Config, list[tuple[float, float]]]

MAX_DROP = GuardSection.max_accuracy_drop  # the study file's defaults
BASELINE_RUNS = GuardSection.baseline_runs
MIN_SPEEDUP = ConfirmSection.min_speedup


def load(path: Path) -> tuple[str, Runs, Runs]:
    """A grid file's framework, its passes and the paired rounds of its top (search_quality.py's)."""
    data = json.loads(path.read_text())
    return data["framework"], grid_runs(data["runs"]), grid_runs(data.get("top", []))


class Replay:
    """One seed's draws from the grid, and the reference every pick is scored against."""

    def __init__(self, runs: Runs, baseline: Config, rng: random.Random, top: Runs | None = None) -> None:
        self.runs, self.baseline, self.rng = runs, baseline, rng
        self.knobs = {k: sorted({dict(c)[k] for c in runs}, key=str) for k, _ in next(iter(runs))}
        self.floor = statistics.fmean(a for _, a in runs[baseline]) - MAX_DROP  # the reference's
        # The study's seed: pass p of the grid ran every configuration with seed p, as a study runs
        # every search trial with its own seed (and its baseline's second run with seed + 1), so a
        # replayed trial's accuracy is pass p's: one study sees one seed's luck for all its trials.
        passes = len(runs[baseline])
        self.seed = rng.randrange(passes)
        # knobtune's own floors, from its baseline's seeds: the search's and the verdict's
        self.base_seeds = [runs[baseline][(self.seed + i) % passes][1] for i in range(min(BASELINE_RUNS, passes))]
        self.search_floor = accuracy_floor(self.base_seeds, MAX_DROP)
        self.final_floor = final_floor(self.base_seeds, MAX_DROP)
        medians = grid_table(runs)
        reference = settled(medians, top or {}, runs)  # the paired rounds of the top, where measured
        self.table = {c: rate for c, (rate, accuracy) in reference.items() if accuracy >= self.floor}
        # the best as search_quality.py scores it: where the top has paired rounds, chosen on half of
        # them and measured on the other half (split_best), not inflated by its own luck
        split = split_best(medians, top, runs, self.floor) if top else None
        self.best = split[0] if split else max(self.table.values())

    def measure(self, config: Config) -> tuple[float, float]:
        """A search trial: its rate one of the configuration's passes at random (the machine's
        noise), its accuracy the study's seed's (a pass that could not run, could not)."""
        rate, _ = self.rng.choice(self.runs[config])
        same_seed = self.runs[config][self.seed]
        return (0.0, 0.0) if same_seed == (0.0, 0.0) or rate == 0 else (rate, same_seed[1])

    def score(self, config: Config) -> float:
        return self.table.get(config, 0.0) / self.best


def confirm(replay: Replay, measured: dict[Config, tuple[float, float]], rounds: int, candidates: int = 3,
            model: bool = False, pooled: bool = False, hedged: Sequence[str] = ()) -> Config:
    """knobtune's confirmation: the fastest candidates the search's guard passed (by their trials'
    rates, as knobtune ranks them, or with ``model`` by the per-knob effects model's estimates),
    those expected at the verdict's floor first (their trial's accuracy, or with ``pooled`` the
    accuracy model's estimate, as confirm.candidates does), and the baseline, in ``rounds`` rounds
    (each one pass of the grid, for all of them); the winner by knobtune's rule (confirm.choose_winner)
    among those whose mean accuracy over the rounds met the verdict's floor."""
    rank = {c: r for c, (r, _) in measured.items()}
    seen = with_failures([(dict(c), math.log(r) if r > 0 and a >= replay.search_floor else None)
                          for c, (r, a) in measured.items()])
    if model and seen:
        fitted = Effects.fit(seen)
        rank = {c: fitted.estimate(dict(c)) for c in measured}
    expected = {c: a for c, (_, a) in measured.items()}
    known = [(dict(c), a) for c, (r, a) in measured.items() if r > 0]
    if pooled and len(known) >= 2:
        accuracy = Effects.fit(known, ACCURACY_PENALTY)
        expected = {c: accuracy.estimate(dict(c)) for c in measured}
    feasible = sorted((c for c, (r, a) in measured.items() if r > 0 and a >= replay.search_floor
                       and c != replay.baseline), key=lambda c: -rank[c])
    feasible = line_up(feasible, candidates, lambda c: expected[c] >= replay.final_floor,
                       lambda c: tuple(dict(c).get(k) for k in hedged))
    if not feasible:
        return replay.baseline
    # a round is one moment of the machine for everyone in it: here one pass of the grid, drawn at
    # random, in which every candidate and the baseline take that pass's measurement
    # (each round has its own seed, none the search's)
    moments = [replay.rng.choice([p for p in range(min(len(replay.runs[c]) for c in [*feasible, replay.baseline]))
                                  if p != replay.seed]) for _ in range(rounds)]
    # the verdict's floor, as confirm._verdict takes it: every baseline accuracy measured, the rounds' too
    verdict = final_floor(replay.base_seeds + [replay.runs[replay.baseline][p][1] for p in moments], MAX_DROP)
    passed = [c for c in feasible if statistics.fmean(replay.runs[c][p][1] for p in moments) >= verdict]
    rounds_of = {str(i): [{"value": replay.runs[c][p][0] or None} for p in moments] for i, c in enumerate(passed)}
    rounds_of["-1"] = [{"value": replay.runs[replay.baseline][p][0] or None} for p in moments]
    winner, _ = choose_winner(rounds_of, -1, list(range(len(passed))), False, MIN_SPEEDUP)
    return passed[winner] if winner >= 0 else replay.baseline


def framework_advice(path: Path, runs: Runs) -> dict[str, Any]:
    """The seeds' advice (the framework space's ``advice``) on a CPU with the grid's cores and bf16
    (done in hardware or not: as the grid file records it, else as on this machine), for the knobs
    and values the grid has: the trial knobtune queues after the baseline."""
    from knobtune.trainers.common import hostinfo

    measured = json.loads(path.read_text()).get("measured", {})
    ctx = {"hardware": {"usable_cores": measured.get("cpus", 2), "cuda": False, "bf16": True,
                        "bf16_native": measured.get("bf16_native", hostinfo.cpu_bf16_native())}}
    offered: dict[str, set] = {}
    for config in runs:
        for k, v in config:
            offered.setdefault(k, set()).add(v)
    framework = json.loads(path.read_text())["framework"]
    return {k: v for k, v in for_framework(framework).advice(ctx).items() if v in offered.get(k, ())}


Trial = tuple[Config, tuple[float, float]]  # a configuration and what its replayed trial measured
Strategy = Callable[[Replay, int, list[Config], int], list[Trial]]


def random_search(replay: Replay, budget: int, first: list[Config], seed: int) -> list[Trial]:
    """Optuna's RandomSampler's equivalent: the baseline, then configurations drawn uniformly."""
    rng = random.Random(seed)
    configs = list(replay.runs)
    return [(c, replay.measure(c)) for c in [first[0]] + [rng.choice(configs) for _ in range(budget - 1)]]


def whole_grid(replay: Replay, budget: int, first: list[Config], seed: int) -> list[Trial]:
    """Every configuration measured once, whatever the budget: not a strategy but its ceiling, what
    confirmation makes of a search that missed nothing (on a grid whose top is flatter than the
    machine's noise, it still cannot pick the best every time)."""
    return [(c, replay.measure(c)) for c in [first[0], *(c for c in replay.runs if c != first[0])]]


def sampler_search(make: Callable[[int, Callable[[dict], bool], float], optuna.samplers.BaseSampler]) -> Strategy:
    """Another Optuna sampler in TPE's place (the same queue: the baseline and the advice first).
    ``make(seed, invalid, floor)``: ``invalid`` tells what cannot run, as knobtune hands the effects
    sampler its ``known_invalid`` (here, the configurations whose every pass could not run);
    ``floor`` is the verdict's accuracy floor, as knobtune hands it the sampler."""
    def search(replay: Replay, budget: int, first: list[Config], seed: int) -> list[Trial]:
        def invalid(params: dict) -> bool:
            return all(run == (0.0, 0.0) for run in replay.runs[tuple(sorted(params.items()))])

        study = optuna.create_study(direction="maximize", sampler=make(seed, invalid, replay.final_floor))
        for config in first:
            study.enqueue_trial(dict(config))
        asked = []
        for _ in range(budget):
            trial = study.ask()
            config = tuple(sorted((k, trial.suggest_categorical(k, v)) for k, v in replay.knobs.items()))
            rate, accuracy = replay.measure(config)
            if rate == 0 and accuracy == 0:  # the grid's record of a run that could not run: told as knobtune
                trial.set_user_attr("outcome", "invalid")  # tells it (no accuracy: nothing was trained)
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            else:  # as knobtune tells a trial: its rate, and the accuracy guard as a constraint
                trial.set_user_attr("val_accuracy", accuracy)
                trial.set_constraint("accuracy", round(replay.search_floor - accuracy, 6))
                study.tell(trial, rate)
            asked.append((config, (rate, accuracy)))
        return asked
    return search


# knobtune's TPE (search/study/study.py: make_sampler) for a budget of 9 to 11 trials, one study at a time
tpe = sampler_search(lambda seed, *_: optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True,
                                                             n_startup_trials=3))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("grid", type=Path)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--candidates", type=int, default=3, help="confirmation's top_k (default 3)")
    parser.add_argument("--only", default="", help="the strategies whose name contains this (default all)")
    parser.add_argument("--advice", default=None,
                        help="the advice trial's knob values, as JSON (default: the framework's advice on a CPU "
                             "with the grid's cores, as knobtune queues it, on the grid's knobs)")
    parser.add_argument("--bonus", type=float, nargs="*", default=[],
                        help="also replay the effects sampler (with the accuracy floor) at these bonus values")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    framework, runs, top = load(args.grid)
    base = grid_baseline(framework, runs)
    advice = tuple(sorted({**dict(base), **(json.loads(args.advice) if args.advice is not None
                                             else framework_advice(args.grid, runs))}.items()))
    strategies: dict[str, Strategy] = {
        "random": random_search,
        "the whole grid once (its ceiling)": whole_grid,
        "tpe (knobtune's)": tpe,
        "tpe univariate": sampler_search(lambda s, *_: optuna.samplers.TPESampler(seed=s, n_startup_trials=3)),
        "gp": sampler_search(lambda s, *_: optuna.samplers.GPSampler(seed=s, n_startup_trials=3)),
        "effects (knobtune's)": sampler_search(lambda s, invalid, floor: EffectsSampler(
            seed=s, floor=lambda _: floor, invalid=invalid)),
        "effects, invalid tried": sampler_search(lambda s, _, floor: EffectsSampler(seed=s, floor=lambda _: floor)),
        "effects, no floor": sampler_search(lambda s, *_: EffectsSampler(seed=s)),
        **{f"effects+acc bonus {b}": sampler_search(
            lambda s, _, floor, b=b: EffectsSampler(seed=s, bonus=b, floor=lambda _: floor)) for b in args.bonus},
    }
    floor = Replay(runs, base, random.Random(0), top).floor
    close = {k for k, (_, high, _) in reference_spread(runs, top, floor).items() if high >= 0.95}
    print(f"{framework}: {len(runs)} configurations; baseline {dict(base)}; advice {dict(advice)}; "
          f"{len(close)} the grid cannot tell from its best (95th percentile of their ratio >= 0.95)")
    chosen = [(name, s) for name, s in strategies.items() if args.only in name]
    # confirmation's variants, each on the same searches and the same rounds: candidates ranked by
    # their trials' rates or by the effects model; expected at the verdict's floor by their own
    # trial's accuracy or by the pooled accuracy model (knobtune's)
    learning = for_framework(framework).learning_knobs
    variants = {"rates, own accuracy": (False, False, ()), "rates, pooled": (False, True, ()),
                "model, own accuracy": (True, False, ()), "model, pooled": (True, True, ()),
                "rates, pooled, hedged": (False, True, learning), "model, pooled, hedged": (True, True, learning)}
    for name, strategy in chosen:
        found: dict[str, list[float]] = {v: [] for v in variants}
        told: dict[str, list[bool]] = {v: [] for v in variants}
        reach = []
        for seed in range(args.seeds):
            replay = Replay(runs, base, random.Random(seed), top)
            asked = strategy(replay, args.trials, [base] if name == "random" else [base, advice], seed)
            measured: dict[Config, tuple[float, float]] = {}
            for c, m in asked:  # (a configuration asked again keeps its first measurement, as a study skips it)
                measured.setdefault(c, m)
            for variant, (model, pooled, hedged) in variants.items():
                replay.rng = random.Random(1_000_003 * seed + 1)  # the same rounds for every variant
                pick = confirm(replay, measured, args.rounds, args.candidates, model=model, pooled=pooled,
                               hedged=hedged)
                found[variant].append(replay.score(pick))
                told[variant].append(pick in close)
            best, hit = 0.0, None
            for i, (c, _) in enumerate(asked, start=1):
                best = max(best, replay.score(c))
                if hit is None and best >= 0.95:
                    hit = i
            reach.append(hit)
        hits = [h for h in reach if h is not None]
        print(f"{name}: a trial within 95 %: {len(hits) / len(reach):.0%} of seeds, median trial "
              f"{statistics.median(hits) if hits else float('nan'):.0f}")
        for variant in variants:
            picks = found[variant]
            print(f"    confirmed ({variant:21s}) / grid best: median {statistics.median(picks):.2f}, "
                  f"seeds >= 0.95: {sum(f >= 0.95 for f in picks) / len(picks):.0%}, worst {min(picks):.2f}, "
                  f"not told from the best: {sum(told[variant]) / len(picks):.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
