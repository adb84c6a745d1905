"""Search quality: knobtune's search vs Optuna's RandomSampler vs a Lightning-style policy.

One run on this machine, on digits-mlp, over a space small enough to enumerate (--space: small, 32
configurations; TensorFlow's xla adds jit_compile, 64):
  1. the exhaustive grid, each configuration measured in --grid-repeats passes with different
     seeds: the reference table (median rate, mean accuracy; the guard's floor is knobtune's final
     rule applied to the grid's runs of the baseline);
  2. for each seed, with the same trial budget: a knobtune study (its sampler, baseline, the seeds'
     advice, confirmation of the winner) and a plain random-search study (RandomSampler, the
     baseline first as the accuracy guard needs it, no advice, no confirmation);
  3. the Lightning-style policy: the largest batch that runs, every other knob at its default;
  3b. beside the searches (--beside-rounds): the grid's top, every pick and the Lightning-style
     choice measured again in paired rounds, in the same hour as the searches (the grid may be
     hours old, and this machine's top reorders between hours): the first reference printed;
  4. the knobtune winner: burst-length and 10x longer runs, paired, against what it predicted.
Every configuration is scored by its entry in the grid table (one common measurement), so the
strategies are compared on what they chose, not on the luck of their own measurements. Where the
reference has paired rounds, its best is the configuration chosen on half of them and measured on
the other half (``split_best``): the fastest by every round overstates the best by its own luck,
and on a flat top a pick as good as the best would score under it.

Prints, as ratios: best found / grid best (and within the wall time of --trials full trials:
a strategy that measures more configurations more cheaply, pruning, gets its due), trials to
reach 95 % of the grid best (knobtune vs random), Lightning-style / knobtune, and the burst's
prediction error; each with its spread over the seeds. --grid-file keeps the measured grid (per
framework and space) so that later runs on the same machine compare searches on one reference.

    .venv/bin/python benchmarks/search_quality.py [--framework pytorch] [--space small] [--trials 10]
        [--seeds 5] [--grid-file grid-pytorch.json]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from optuna.trial import FrozenTrial

from knobtune.search.storage.record import TrialRecord
from knobtune.search.study.definition import SAMPLERS, StudySection
from knobtune.search.study.objective import final_floor

from _bench import TRAIN_SAMPLES as TRAIN_SAMPLES_COMMON
from _bench import (grid_runs, grid_table, plan_for, reference_spread, run_params, run_study, settled, space_lines,
                    split_best, study_text)

SEARCHED = {
    "pytorch": {"batch_size": [64, 128, 256, 512], "num_workers": [0, 2], "intra_op_threads": [0, 1],
                "amp": ["off", "bf16"], "persistent_workers": [True]},
    "tensorflow": {"batch_size": [64, 128, 256, 512], "map_parallel_calls": [0, "autotune"],
                   "prefetch": [0, "autotune"], "steps_per_execution": [1, 8]},
}
# (framework, --space): "small" is 32 configurations; TensorFlow's "xla" adds jit_compile (64), the knob a
# TF user tries first, which on this CPU costs about a third of the rate: a space where knobs matter
SPACES = {(fw, "small"): space_lines(fw, searched) for fw, searched in SEARCHED.items()}
SPACES["tensorflow", "xla"] = space_lines("tensorflow", {**SEARCHED["tensorflow"], "jit_compile": [False, True]})
BASELINE_EXTRA = {"pytorch": "persistent_workers = true\n", "tensorflow": ""}
TOP_BAND = 0.10  # configurations this close to the grid's best are settled in paired rounds
# The burst per framework (--train-samples). TensorFlow's at the benchmarks' common 16,000 samples: on this box
# most of its trials were marked noisy, the input pipeline's read-ahead with no room to drain before the windows
# (knobtune's own notes asked for up to 41,000) and windows under 0.1 s at batch 512; and batch 512 with
# steps_per_execution 8 could not run at all (fewer than 5 executions). 48,000 leaves room for all of them.
TRAIN_SAMPLES = {"pytorch": TRAIN_SAMPLES_COMMON, "tensorflow": 48000}


def _read_grid(path: Path | None, framework: str, space: str, train_samples: int,
               expected: dict[tuple, list[tuple[float, float]]]) -> tuple[dict, dict] | None:
    """The grid measured earlier at ``path`` (its passes, and the paired rounds of its top when
    measured), when it holds this framework's space and every configuration. One measured with other
    bursts than ``train_samples`` (a file that does not say: the common 16,000) is refused."""
    if path is None or not path.exists():
        return None
    data = json.loads(path.read_text())
    if data.get("framework") != framework or data.get("space") != space:
        print(f"   {path} holds another framework or space: measuring the grid again", flush=True)
        return None
    if data.get("train_samples", TRAIN_SAMPLES_COMMON) != train_samples:  # not overwritten: it is a measurement
        raise SystemExit(f"search_quality: {path} was measured with bursts of "
                         f"{data.get('train_samples', TRAIN_SAMPLES_COMMON):,} samples, not {train_samples:,}: "
                         f"pass --train-samples {data.get('train_samples', TRAIN_SAMPLES_COMMON)} to use it, "
                         "or another --grid-file to measure a grid with these bursts")
    runs = grid_runs(data["runs"])
    return (runs, grid_runs(data.get("top", []))) if set(runs) == set(expected) else None


def _write_grid(path: Path, framework: str, space: str, train_samples: int, runs: dict, top: dict) -> None:
    """The grid's passes and paired rounds, with when and where they were measured (a later run
    compares its baseline with the grid's: the machine may have changed since)."""
    import datetime
    import platform

    from knobtune.trainers.common import hostinfo

    # (bf16_native: the seeds' advice asks for bf16 only on a CPU that does it in hardware; the replay reads it)
    path.write_text(json.dumps({"framework": framework, "space": space, "train_samples": train_samples,
                                "measured": {"date": datetime.date.today().isoformat(), "cpus": os.cpu_count(),
                                             "machine": platform.machine(), "cpu_model": hostinfo.host()["cpu_model"],
                                             "bf16_native": hostinfo.cpu_bf16_native()},
                                "runs": [[list(map(list, k)), v] for k, v in runs.items()],
                                "top": [[list(map(list, k)), v] for k, v in top.items()]}))


def _rounds(plan: Any, configs: dict[tuple, dict[str, Any]], rounds: int, first_seed: int, label: str,
            first_round: int = 0) -> dict[tuple, list[tuple[float, float]]]:
    """Each of ``configs`` measured once a round, every round in its own shuffled order (round r
    with seed offset ``first_seed`` + r): its (samples/s, accuracy) runs, paired by round."""
    runs: dict[tuple, list[tuple[float, float]]] = {k: [] for k in configs}
    order = list(configs)
    for r in range(first_round, first_round + rounds):
        random.Random(r).shuffle(order)
        for i, k in enumerate(order):
            m = run_params(plan, configs[k], f"{label} {r + 1}:{i + 1}/{len(order)}",
                           seed_offset=first_seed + r - first_round)
            runs[k].append((m.samples_per_second or 0.0, m.val_accuracy or 0.0))
    return runs


def _summary(name: str, ref: dict[tuple, tuple[float, float]], floor: float, key: Callable[[dict], tuple],
             picks: dict[str, list[FrozenTrial | None]], searches: dict[str, list[Any]], budgets: list[float],
             trials: int, split: tuple[float, list[tuple]] | None = None) -> None:
    """The comparison's lines, every choice scored by the reference ``ref`` (rate, accuracy per
    configuration; one under ``floor`` scores 0) against its best: with ``split`` (``split_best``,
    where the reference has paired rounds), the best's rate measured on rounds that did not choose
    it, so a pick as good as the best scores about 1 (and may score over it)."""
    fastest = max(rate for rate, acc in ref.values() if acc >= floor)
    best = split[0] if split else fastest

    def score(params: dict[str, Any]) -> float:
        rate, acc = ref.get(key(params), (0.0, 0.0))
        return rate / best if acc >= floor else 0.0

    def within_wall(study: Any, budget: float) -> float:
        """The best measured among the trials that finished within ``budget`` seconds of trial time."""
        spent, got = 0.0, 0.0
        for t in sorted(study.trials, key=lambda t: t.number):
            if t.datetime_start is None or t.datetime_complete is None:
                continue
            spent += (t.datetime_complete - t.datetime_start).total_seconds()
            if spent > budget:
                break
            got = max(got, score(t.params))
        return got

    def to_95(study: Any) -> int | None:
        got = 0.0
        numbered = [t for t in sorted(study.trials, key=lambda t: t.number) if TrialRecord.of(t).outcome]
        for i, t in enumerate(numbered, start=1):
            got = max(got, score(t.params))
            if got >= 0.95:
                return i
        return None

    found = {s: [score(p.params) if p else 0.0 for p in ps] for s, ps in picks.items()}
    in_wall = {s: [within_wall(st, b) for st, b in zip(ss, budgets)] for s, ss in searches.items()}
    reach = {s: [to_95(st) for st in ss] for s, ss in searches.items()}

    def seeds(values: list[float]) -> str:
        return f"{statistics.median(values):.2f} (seeds {[round(v, 2) for v in values]})"

    def fmt_reach(values: list[int | None]) -> str:
        got = [v for v in values if v is not None]
        return (f"median {statistics.median(got):.0f} trials" if got else "never") + \
            f" ({len(got)}/{len(values)} seeds reached it: {values})"

    print(f"\nreference: {name}; best {best:,.0f} samples/s"
          + (f" (chosen on half its rounds, measured on the other half: {', '.join(str(dict(k)) for k in split[1])}; "
             f"the fastest by all its rounds {fastest:,.0f}, {fastest / best:.2f}x)" if split else ""))
    print(f"best found / best          knobtune {seeds(found['knobtune'])}   random {seeds(found['random'])}")
    margins = [k - r for k, r in zip(found["knobtune"], found["random"])]
    print(f"  knobtune - random, per seed: median {statistics.median(margins):+.2f} "
          f"(from {min(margins):+.2f} to {max(margins):+.2f})")
    print(f"best measured within {trials} full trials' wall time (before confirmation)   "
          f"knobtune {seeds(in_wall['knobtune'])}   random {seeds(in_wall['random'])}")
    print(f"trials to 95% of best      knobtune {fmt_reach(reach['knobtune'])}")
    print(f"                           random   {fmt_reach(reach['random'])}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--framework", choices=sorted(SEARCHED), default="pytorch")
    parser.add_argument("--space", choices=sorted({name for _, name in SPACES}), default="small",
                        help="the grid: small (32 configurations, both frameworks) or xla (TensorFlow: small "
                             "and jit_compile, 64)")
    parser.add_argument("--train-samples", type=int, default=None,
                        help="samples per burst, every measurement's (default: pytorch "
                             f"{TRAIN_SAMPLES['pytorch']:,}, tensorflow {TRAIN_SAMPLES['tensorflow']:,}: "
                             "TensorFlow's read-ahead needs room to drain before the windows)")
    parser.add_argument("--trials", type=int, default=10, help="trial budget per search (default 10)")
    parser.add_argument("--seeds", type=int, default=5,
                        help="searches per strategy, each with its own seed (default 5; 0: measure the grid only)")
    parser.add_argument("--sampler", default=StudySection.sampler, choices=SAMPLERS,
                        help=f"knobtune's sampler (default {StudySection.sampler!r}, a study file's default)")
    parser.add_argument("--grid-file", type=Path, default=None,
                        help="the measured grid, read when it holds this framework's space, else measured and written")
    parser.add_argument("--long-repeats", type=int, default=5,
                        help="paired burst / 10x runs of the winner for the prediction error (default 5)")
    parser.add_argument("--grid-repeats", type=int, default=3,
                        help="passes over the grid, each with its own seed; a config is scored by its median "
                             "rate and mean accuracy (default 3; a --grid-file with fewer gets the rest measured "
                             "and added, one with more is read whole)")
    parser.add_argument("--beside-rounds", type=int, default=6,
                        help="paired rounds, after the searches, of the grid's top, every pick and the "
                             "Lightning-style choice: the reference measured in the same hour as the searches, "
                             "which the others are printed beside; 0: none (default 6)")
    parser.add_argument("--top-rounds", type=int, default=8,
                        help=f"paired rounds of the grid's top (within {TOP_BAND:.0%}% of its best, or not told from "
                             "it by the passes), the reference "
                             "the searches are scored by; 0: the grid's medians only (default 8)")
    args = parser.parse_args()
    fw = args.framework
    if (fw, args.space) not in SPACES:
        parser.error(f"--space {args.space} is not defined for {fw}; it has: "
                     f"{', '.join(name for f, name in SPACES if f == fw)}")
    space_text = SPACES[fw, args.space]
    train_samples = args.train_samples or TRAIN_SAMPLES[fw]

    def text(name: str, seed: int, sampler: str = "tpe") -> str:
        t = study_text(name, fw, args.trials, seed, space_text, train_samples)
        t = t.replace("[baseline]\nbatch_size = 64\n", "[baseline]\nbatch_size = 64\n" + BASELINE_EXTRA[fw])
        return t.replace(f"seed = {seed}\n", f"seed = {seed}\nsampler = \"{sampler}\"\n")

    plan = plan_for(text("grid", 0))
    print(f"bursts of {train_samples:,} samples ({plan.definition.burst.warmup_samples:,} of them warm-up), "
          f"{plan.definition.burst.windows} windows", flush=True)
    space, offer = plan.space, plan.offer
    drop = plan.definition.guard.max_accuracy_drop

    def key(params: dict[str, Any]) -> tuple:
        """A configuration by the knobs that vary in this space (fixed ones may be left out)."""
        return tuple(sorted((k, v) for k, v in params.items() if len(offer.choices.get(k, ())) > 1))

    grid = list(space.grid(offer))
    params_of = {key(p): p for p in grid}
    measured: dict[tuple, list[tuple[float, float]]] = {key(p): [] for p in grid}
    kept = _read_grid(args.grid_file, fw, space_text, train_samples, measured)
    done = min(len(v) for v in kept[0].values()) if kept is not None else 0
    top_runs: dict[tuple, list[tuple[float, float]]] = {}
    if kept is not None:
        measured = {k: v[:done] for k, v in kept[0].items()}
        top_runs = kept[1]
        when = json.loads(args.grid_file.read_text()).get("measured", {}).get("date", "on an unrecorded date")
        print(f"1. exhaustive grid ({fw}): {len(grid)} configurations, {done} passes read from {args.grid_file} "
              f"(measured {when})"
              + (f", {args.grid_repeats - done} more to measure" if args.grid_repeats > done else ""), flush=True)
    else:
        print(f"1. exhaustive grid ({fw}): {len(grid)} configurations, {args.grid_repeats} passes", flush=True)
    if args.grid_repeats > done:
        for rep in range(done, args.grid_repeats):  # each pass with its own seed: accuracies vary as they do
            for i, params in enumerate(grid):
                r = run_params(plan, params, f"{rep + 1}:{i + 1}/{len(grid)}", seed_offset=rep)
                measured[key(params)].append((r.samples_per_second or 0.0, r.val_accuracy or 0.0))
        top_runs = {}  # the top is chosen on the passes: new passes, a new top
        if args.grid_file is not None:
            _write_grid(args.grid_file, fw, space_text, train_samples, measured, top_runs)
    passes = min(len(v) for v in measured.values())
    print(f"   {passes} passes", flush=True)
    spreads = [max(r for r, _ in v) / min(r for r, _ in v) - 1 for v in measured.values() if min(r for r, _ in v) > 0]
    print(f"   the grid's own spread: a configuration's fastest pass over its slowest, median "
          f"{statistics.median(spreads):.0%}, max {max(spreads):.0%}", flush=True)
    table = grid_table(measured)
    base_params = space.baseline_params(offer, plan.ctx, plan.definition.baseline)
    # the reference guard is knobtune's final rule, on the grid's seeded runs: a configuration's mean
    # accuracy against the baseline's mean minus max_accuracy_drop
    floor = final_floor([acc for _, acc in measured[key(base_params)]], drop)
    grid_best = max(v[0] for v in table.values() if v[1] >= floor)

    # The passes ran minutes apart, and the machine drifts between minutes by more than the top
    # configurations differ: those within TOP_BAND of the best, and those the passes alone cannot
    # tell from it (on a drifting machine, more than the band holds), are measured again in paired rounds.
    unsure = {k for k, (_, high, _) in reference_spread(measured, {}, floor).items() if high >= 0.95}
    top = sorted({k for k, (rate, acc) in table.items() if acc >= floor and rate >= (1 - TOP_BAND) * grid_best}
                 | unsure, key=repr)
    if set(top_runs) != set(top):
        top_runs = {}
    have = min((len(v) for v in top_runs.values()), default=0)
    if args.top_rounds > have and len(top) > 1:
        print(f"   the top ({len(top)} configurations within {TOP_BAND:.0%} of the best or not told from it): "
              f"{args.top_rounds - have} paired rounds, each in its own shuffled order", flush=True)
        more = _rounds(plan, {k: params_of[k] for k in top}, args.top_rounds - have, first_seed=passes + have,
                       label="top", first_round=have)
        top_runs = {k: top_runs.get(k, [])[:have] + more[k] for k in top}
        if args.grid_file is not None:
            _write_grid(args.grid_file, fw, space_text, train_samples, measured, top_runs)
    top_runs = {k: v[:args.top_rounds] for k, v in top_runs.items()} if args.top_rounds else {}
    references = {**({"paired top": settled(table, top_runs, measured)} if top_runs else {}), "grid medians": table}
    splits = {"paired top": split_best(table, top_runs, measured, floor)} if top_runs else {}
    for name, ref in references.items():
        ranked = sorted(top, key=lambda k: -ref[k][0])
        print(f"   reference '{name}': " + ", ".join(f"{ref[k][0]:,.0f}" for k in ranked), flush=True)
    spread = reference_spread(measured, top_runs, floor)
    close = {k for k, (_, high, _) in spread.items() if high >= 0.95}
    print(f"   the reference's own spread (passes and paired rounds drawn again, 1000 times): a configuration's "
          f"rate / the best's, 5th-95th percentile, and how often it is within 95 % of the best; "
          f"{len(close)} cannot be told from the best", flush=True)
    for k in sorted(spread, key=lambda k: -spread[k][2])[:max(len(top), len(close))]:
        low, high, share = spread[k]
        print(f"     {low:.2f}-{high:.2f}  {share:4.0%}  {dict(k)}", flush=True)

    if args.seeds == 0:  # the grid and its paired top only (kept with --grid-file), no searches
        return 0

    from knobtune.search.story import results

    picks: dict[str, list[FrozenTrial | None]] = {"knobtune": [], "random": []}
    searches: dict[str, list[Any]] = {"knobtune": [], "random": []}
    budgets: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'quality.db'}"
        for seed in range(args.seeds):
            studies = {}
            for strategy, sampler in (("knobtune", args.sampler), ("random", "random")):
                print(f"\n2. seed {seed}: {strategy}, {args.trials} trials", flush=True)
                study, _ = run_study(text(f"{strategy}-{seed}", seed, sampler), url, confirm=strategy == "knobtune")
                studies[strategy] = study
                picks[strategy].append(results.best(study))
                searches[strategy].append(study)
                pick = picks[strategy][-1]  # (printed, so that a log can be scored against another grid)
                print(f"   seed {seed}: {strategy} picked "
                      + (f"#{pick.number} {dict(key(pick.params))}" if pick else "nothing"), flush=True)
            # the wall time of --trials full trials: random search's trials are never pruned
            full = [(t.datetime_complete - t.datetime_start).total_seconds() for t in studies["random"].trials
                    if t.datetime_start is not None and t.datetime_complete is not None]
            budgets.append(args.trials * statistics.median(full) if full else 0.0)

    print("\n3. Lightning-style: the largest batch that runs, other knobs at defaults", flush=True)
    lightning = dict(base_params, batch_size=max(offer.choices["batch_size"]))

    # The grid may be hours old, and on this machine the top reorders between hours: its top, every
    # pick and the Lightning-style choice are measured again now, in paired rounds (each round in its
    # own shuffled order, with seeds no pass or round used), the reference of the same hour.
    beside_keys = sorted(set(top) | {key(p.params) for ps in picks.values() for p in ps if p} | {key(lightning)},
                         key=repr)
    if args.beside_rounds:
        print(f"\n3b. beside the searches: {len(beside_keys)} configurations (the grid's top, every pick, "
              f"Lightning-style), {args.beside_rounds} paired rounds", flush=True)
        beside_runs = _rounds(plan, {k: params_of[k] for k in beside_keys}, args.beside_rounds,
                              first_seed=passes + args.top_rounds, label="beside")
        every_run = {k: measured[k] + top_runs.get(k, []) for k in measured}  # (accuracies: every seed measured)
        references = {"beside the searches": settled(table, beside_runs, every_run), **references}
        splits["beside the searches"] = split_best(table, beside_runs, every_run, floor)
        spread = reference_spread(measured, beside_runs, floor)
        close = {k for k, (_, high, _) in spread.items() if high >= 0.95}
        ref = references["beside the searches"]
        print("   reference 'beside the searches': " + ", ".join(
            f"{ref[k][0]:,.0f}" for k in sorted(beside_keys, key=lambda k: -ref[k][0])), flush=True)
        print(f"   its own spread: {len(close)} cannot be told from the best", flush=True)
        for k in sorted(spread, key=lambda k: -spread[k][2])[:len(close)]:
            low, high, share = spread[k]
            print(f"     {low:.2f}-{high:.2f}  {share:4.0%}  {dict(k)}", flush=True)

    print(f"\n4. the knobtune winner (seed 0), burst and 10x longer runs, paired x{args.long_repeats}", flush=True)
    winner = next((w for w in picks["knobtune"] if w is not None), None)
    study_of_winner = searches["knobtune"][picks["knobtune"].index(winner)] if winner else None
    burst = plan.definition.burst
    long_plan = replace(plan, definition=replace(plan.definition, burst=replace(
        burst, train_samples=burst.train_samples * 10, timeout_s=burst.timeout_s * 10)))
    bursts, longs = [], []
    for r in range(args.long_repeats if winner else 0):  # paired, so that drift of the machine hits both alike
        bursts.append(run_params(plan, dict(winner.params), f"burst[{r}]").samples_per_second or float("nan"))
        longs.append(run_params(long_plan, dict(winner.params), f"10x[{r}]").samples_per_second or float("nan"))

    print(f"\n=== search quality on digits-mlp ({fw}, space {args.space}), this machine; knobtune's sampler "
          f"{args.sampler}; {len(grid)} configurations, "
          f"{sum(v[1] >= floor for v in table.values())} pass the accuracy guard (>= {floor:.3f}); "
          f"budget {args.trials} trials, {args.seeds} seeds ===")
    rounds = min((len(v) for v in top_runs.values()), default=0)
    print(f"the grid: {passes} passes (a configuration's fastest over its slowest: median "
          f"{statistics.median(spreads):.0%}); its top {len(top)} in {rounds} paired rounds"
          + (f"; beside the searches, {len(beside_keys)} configurations in {args.beside_rounds} paired rounds"
             if args.beside_rounds else ""))
    for name, ref in references.items():
        _summary(name, ref, floor, key, picks, searches, budgets, args.trials, splits.get(name))
    # the grid may have been measured on another day (--grid-file): the baseline now against then
    bases = (results.baseline(study) for studies in searches.values() for study in studies)
    now = [rate for rate in (TrialRecord.of(b).samples_per_second for b in bases if b) if rate]
    if now:
        then = table[key(base_params)][0]
        ratio = statistics.median(now) / then
        print(f"\nthe baseline in these searches: median {statistics.median(now):,.0f} samples/s, "
              f"{ratio:.2f}x the grid's ({then:,.0f})"
              + ("" if 0.8 <= ratio <= 1.25 else "; the machine has changed since the grid: its ranking may not "
                 "hold now"))
    told = {s: [bool(p) and key(p.params) in close for p in ps] for s, ps in picks.items()}
    print(f"\npicks the reference '{next(iter(references))}' cannot tell from its best (95th percentile of "
          f"their ratio >= 0.95; {len(close)} of "
          f"{len(grid)} configurations): knobtune {sum(told['knobtune'])}/{args.seeds}   "
          f"random {sum(told['random'])}/{args.seeds}")
    table_l = references[next(iter(references))]
    l_sps, l_acc = table_l[key(lightning)]
    knob_best = statistics.median([table_l[key(w.params)][0] if w else 0.0 for w in picks["knobtune"]]) or float("nan")
    print(f"Lightning-style / knobtune = {l_sps / knob_best:.2f}  (batch {lightning['batch_size']}: {l_sps:,.0f} "
          f"samples/s, accuracy {l_acc:.3f}{'' if l_acc >= floor else ', BELOW the accuracy guard'})")
    if winner and longs:
        confirmed = results.confirmation(study_of_winner) or {}
        predictions = {"the search trial's burst": TrialRecord.of(winner).samples_per_second,
                       "the confirmed median": (confirmed.get("medians") or {}).get(str(winner.number)),
                       "a burst run beside each long run": statistics.median(bursts)}
        long_rate = statistics.median(longs)
        print(f"prediction error           10x run {long_rate:,.0f} samples/s (runs {[round(v) for v in longs]}); "
              f"predicted by")
        for label, value in predictions.items():
            if value:
                print(f"                             {label}: {value:,.0f} samples/s, {value / long_rate - 1:+.1%}")
        paired = [b / l_ - 1 for b, l_ in zip(bursts, longs) if b == b and l_ == l_]
        if paired:  # the same minute of the machine for both: the error the protocol itself makes
            print(f"                             paired, burst / 10x run beside it: median "
                  f"{statistics.median(paired):+.1%} over {len(paired)} pairs "
                  f"(each {', '.join(f'{p:+.0%}' for p in paired)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
