"""Search quality: knobtune's search vs Optuna's RandomSampler vs a Lightning-style policy.

One run on this machine, on digits-mlp, over a space small enough to enumerate:
  1. the exhaustive grid, each configuration measured in --grid-repeats passes with different
     seeds: the reference table (median rate, mean accuracy; the guard's floor is knobtune's final
     rule applied to the grid's runs of the baseline);
  2. for each seed, with the same trial budget: a knobtune study (TPE, baseline, the seeds'
     advice, confirmation of the winner) and a plain random-search study (RandomSampler, the
     baseline first as the accuracy guard needs it, no advice, no confirmation);
  3. the Lightning-style policy: the largest batch that runs, every other knob at its default;
  4. the knobtune winner: burst-length and 10x longer runs, paired, against what it predicted.
Every configuration is scored by its entry in the grid table (one common measurement), so the
strategies are compared on what they chose, not on the luck of their own measurements.

Prints, as ratios: best found / grid best (and within the wall time of --trials full trials:
a strategy that measures more configurations more cheaply, pruning, gets its due), trials to
reach 95 % of the grid best (knobtune vs random), Lightning-style / knobtune, and the burst's
prediction error; each with its spread over the seeds. --grid-file keeps the measured grid (per
framework and space) so that later runs on the same machine compare searches on one reference.

    .venv/bin/python benchmarks/search_quality.py [--framework pytorch] [--trials 10] [--seeds 5]
        [--grid-file grid-pytorch.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from knobtune.search.storage.record import TrialRecord
from knobtune.search.study.definition import SAMPLERS, StudySection
from knobtune.search.study.objective import final_floor

from _bench import plan_for, run_params, run_study, space_lines, study_text

SPACES = {
    "pytorch": space_lines("pytorch", {"batch_size": [64, 128, 256, 512], "num_workers": [0, 2],
                                       "intra_op_threads": [0, 1], "amp": ["off", "bf16"], "persistent_workers": [True]}),
    "tensorflow": space_lines("tensorflow", {"batch_size": [64, 128, 256, 512], "map_parallel_calls": [0, "autotune"],
                                             "prefetch": [0, "autotune"], "steps_per_execution": [1, 8]}),
}
BASELINE_EXTRA = {"pytorch": "persistent_workers = true\n", "tensorflow": ""}


def _read_grid(path: Path | None, framework: str, space: str,
               expected: dict[tuple, list[tuple[float, float]]]) -> dict[tuple, list[tuple[float, float]]] | None:
    """The grid measured earlier at ``path``, when it holds this framework's space and every configuration."""
    if path is None or not path.exists():
        return None
    data = json.loads(path.read_text())
    if data.get("framework") != framework or data.get("space") != space:
        print(f"   {path} holds another framework or space: measuring the grid again", flush=True)
        return None
    runs = {tuple(tuple(pair) for pair in k): [tuple(r) for r in v] for k, v in data["runs"]}
    return runs if set(runs) == set(expected) else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--framework", choices=sorted(SPACES), default="pytorch")
    parser.add_argument("--trials", type=int, default=10, help="trial budget per search (default 10)")
    parser.add_argument("--seeds", type=int, default=5)
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
    args = parser.parse_args()
    fw = args.framework

    def text(name: str, seed: int, sampler: str = "tpe") -> str:
        t = study_text(name, fw, args.trials, seed, SPACES[fw])
        t = t.replace("[baseline]\nbatch_size = 64\n", "[baseline]\nbatch_size = 64\n" + BASELINE_EXTRA[fw])
        return t.replace(f"seed = {seed}\n", f"seed = {seed}\nsampler = \"{sampler}\"\n")

    plan = plan_for(text("grid", 0))
    space, offer = plan.space, plan.offer
    drop = plan.definition.guard.max_accuracy_drop

    def key(params: dict[str, Any]) -> tuple:
        """A configuration by the knobs that vary in this space (fixed ones may be left out)."""
        return tuple(sorted((k, v) for k, v in params.items() if len(offer.choices.get(k, ())) > 1))

    grid = list(space.grid(offer))
    measured: dict[tuple, list[tuple[float, float]]] = {key(p): [] for p in grid}
    kept = _read_grid(args.grid_file, fw, SPACES[fw], measured)
    done = min(len(v) for v in kept.values()) if kept is not None else 0
    if kept is not None:
        measured = {k: v[:done] for k, v in kept.items()}
        print(f"1. exhaustive grid ({fw}): {len(grid)} configurations, {done} passes read from {args.grid_file}"
              + (f", {args.grid_repeats - done} more to measure" if args.grid_repeats > done else ""), flush=True)
    else:
        print(f"1. exhaustive grid ({fw}): {len(grid)} configurations, {args.grid_repeats} passes", flush=True)
    if args.grid_repeats > done:
        for rep in range(done, args.grid_repeats):  # each pass with its own seed: accuracies vary as they do
            for i, params in enumerate(grid):
                r = run_params(plan, params, f"{rep + 1}:{i + 1}/{len(grid)}", seed_offset=rep)
                measured[key(params)].append((r.samples_per_second or 0.0, r.val_accuracy or 0.0))
        if args.grid_file is not None:
            args.grid_file.write_text(json.dumps({"framework": fw, "space": SPACES[fw],
                                                  "runs": [[list(map(list, k)), v] for k, v in measured.items()]}))
    print(f"   {min(len(v) for v in measured.values())} passes", flush=True)
    spreads = [max(r for r, _ in v) / min(r for r, _ in v) - 1 for v in measured.values() if min(r for r, _ in v) > 0]
    print(f"   the grid's own spread: a configuration's fastest pass over its slowest, median "
          f"{statistics.median(spreads):.0%}, max {max(spreads):.0%}", flush=True)
    table = {k: (statistics.median(v[0] for v in runs), statistics.fmean(v[1] for v in runs))
             for k, runs in measured.items()}
    base_params = space.baseline_params(offer, plan.ctx, plan.definition.baseline)
    # the reference guard is knobtune's final rule, on the grid's seeded runs: a configuration's mean
    # accuracy against the baseline's mean minus max_accuracy_drop
    floor = final_floor([acc for _, acc in measured[key(base_params)]], drop)
    feasible = {k: v for k, v in table.items() if v[1] >= floor}
    grid_best = max(v[0] for v in feasible.values())

    def score(params: dict[str, Any]) -> float:
        value = table.get(key(params))
        return value[0] if value and value[1] >= floor else 0.0

    def within_wall(study: Any, budget: float) -> float:
        """Best found / grid best among the trials that finished within ``budget`` seconds of trial time."""
        spent, best = 0.0, 0.0
        for t in sorted(study.trials, key=lambda t: t.number):
            if t.datetime_start is None or t.datetime_complete is None:
                continue
            spent += (t.datetime_complete - t.datetime_start).total_seconds()
            if spent > budget:
                break
            best = max(best, score(t.params))
        return best / grid_best

    def to_95(study: Any) -> int | None:
        best = 0.0
        numbered = [t for t in sorted(study.trials, key=lambda t: t.number) if TrialRecord.of(t).outcome]
        for i, t in enumerate(numbered, start=1):
            best = max(best, score(t.params))
            if best >= 0.95 * grid_best:
                return i
        return None

    from knobtune.search.story import results

    found: dict[str, list[float]] = {"knobtune": [], "random": []}
    in_wall: dict[str, list[float]] = {"knobtune": [], "random": []}
    reach: dict[str, list[int | None]] = {"knobtune": [], "random": []}
    winners, study_of_winner = [], []
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'quality.db'}"
        for seed in range(args.seeds):
            studies = {}
            for strategy, sampler in (("knobtune", args.sampler), ("random", "random")):
                print(f"\n2. seed {seed}: {strategy}, {args.trials} trials", flush=True)
                study, _ = run_study(text(f"{strategy}-{seed}", seed, sampler), url, confirm=strategy == "knobtune")
                studies[strategy] = study
                chosen = results.best(study)
                found[strategy].append(score(chosen.params) / grid_best if chosen else 0.0)
                reach[strategy].append(to_95(study))
                if strategy == "knobtune" and chosen:
                    winners.append(chosen)
                    study_of_winner.append(study)
            # the wall time of --trials full trials: random search's trials are never pruned
            full = [(t.datetime_complete - t.datetime_start).total_seconds() for t in studies["random"].trials
                    if t.datetime_start is not None and t.datetime_complete is not None]
            budget = args.trials * statistics.median(full) if full else 0.0
            for strategy, study in studies.items():
                in_wall[strategy].append(within_wall(study, budget))

    print("\n3. Lightning-style: the largest batch that runs, other knobs at defaults", flush=True)
    lightning = dict(base_params, batch_size=max(offer.choices["batch_size"]))
    l_sps, l_acc = table[key(lightning)]

    print(f"\n4. the knobtune winner (seed 0), burst and 10x longer runs, paired x{args.long_repeats}", flush=True)
    winner = winners[0]
    burst = plan.definition.burst
    long_plan = replace(plan, definition=replace(plan.definition, burst=replace(
        burst, train_samples=burst.train_samples * 10, timeout_s=burst.timeout_s * 10)))
    bursts, longs = [], []
    for r in range(args.long_repeats):  # paired, so that drift of the machine hits both alike
        bursts.append(run_params(plan, dict(winner.params), f"burst[{r}]").samples_per_second or float("nan"))
        longs.append(run_params(long_plan, dict(winner.params), f"10x[{r}]").samples_per_second or float("nan"))
    confirmed = results.confirmation(study_of_winner[0]) or {}
    predictions = {"the search trial's burst": TrialRecord.of(winner).samples_per_second,
                   "the confirmed median": (confirmed.get("medians") or {}).get(str(winner.number)),
                   "a burst run beside each long run": statistics.median(bursts)}

    def fmt_reach(values: list[int | None]) -> str:
        got = [v for v in values if v is not None]
        return (f"median {statistics.median(got):.0f} trials" if got else "never") + \
            f" ({len(got)}/{len(values)} seeds reached it: {values})"

    k_found, r_found = statistics.median(found["knobtune"]), statistics.median(found["random"])
    knob_best = statistics.median([score(w.params) for w in winners]) or float("nan")
    print(f"\n=== search quality on digits-mlp ({fw}), this machine; knobtune's sampler "
          f"{args.sampler}; {len(grid)} configurations, "
          f"{len(feasible)} pass the accuracy guard (>= {floor:.3f}); budget {args.trials} trials, {args.seeds} seeds ===")
    print(f"grid best: {grid_best:,.0f} samples/s")
    print(f"best found / grid best     knobtune {k_found:.2f} (seeds {[round(v, 2) for v in found['knobtune']]})   "
          f"random {r_found:.2f} (seeds {[round(v, 2) for v in found['random']]})")
    margins = [k - r for k, r in zip(found["knobtune"], found["random"])]
    print(f"  knobtune - random, per seed: median {statistics.median(margins):+.2f} "
          f"(from {min(margins):+.2f} to {max(margins):+.2f})")
    print(f"best measured within {args.trials} full trials' wall time (before confirmation)   knobtune {statistics.median(in_wall['knobtune']):.2f} "
          f"(seeds {[round(v, 2) for v in in_wall['knobtune']]})   random {statistics.median(in_wall['random']):.2f} "
          f"(seeds {[round(v, 2) for v in in_wall['random']]})")
    print(f"trials to 95% of grid best knobtune {fmt_reach(reach['knobtune'])}")
    print(f"                           random   {fmt_reach(reach['random'])}")
    print(f"Lightning-style / knobtune = {l_sps / knob_best:.2f}  (batch {lightning['batch_size']}: {l_sps:,.0f} samples/s, "
          f"accuracy {l_acc:.3f}{'' if l_acc >= floor else ', BELOW the accuracy guard'})")
    long_rate = statistics.median(longs)
    print(f"prediction error           10x run {long_rate:,.0f} samples/s (runs {[round(v) for v in longs]}); predicted by")
    for label, value in predictions.items():
        if value:
            print(f"                             {label}: {value:,.0f} samples/s, {value / long_rate - 1:+.1%}")
    paired = [b / l - 1 for b, l in zip(bursts, longs) if b == b and l == l]
    if paired:  # the same minute of the machine for both: the error the protocol itself makes
        print(f"                             paired, burst / 10x run beside it: median {statistics.median(paired):+.1%} "
              f"over {len(paired)} pairs (each {', '.join(f'{p:+.0%}' for p in paired)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
