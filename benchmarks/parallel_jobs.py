"""Trials at once on one machine: what ``--jobs`` buys, and what it finds.

1. The same digits-mlp study (a 16-configuration space) with ``--jobs 1`` and with ``--jobs N``
   (default 2: one core each on this 2-core machine), confirmation and diagnosis off: trials per
   minute of each, over the trial phase (first trial's start to last trial's end: the probes,
   one more with --jobs, are left out) and over the whole run, and their ratios (expect 1.6x or
   more with 2 jobs on 2 cores). Prints each trial's share and the affinity its child read back.
2. The exhaustive grid of that space measured on one share (partition 0: the cores one trial of
   the parallel run gets), twice; the parallel search's winner scored by the grid's own
   measurement of it, against the grid's best (found / grid best; 1.00 is the best there is).

    .venv/bin/python benchmarks/parallel_jobs.py [--trials 16] [--jobs 2] [--grid-passes 2]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from knobtune.search.launch import partition
from knobtune.search.storage.record import TrialRecord
from knobtune.search.story import results
from knobtune.search.study.objective import final_floor

from _bench import grid_table, plan_for, run_params, run_study, study_text

# 16 configurations: a 16-trial study does not run out of new ones while two run at once
SPACE = """batch_size = [32, 64, 128, 256]
amp = ["off", "bf16"]
num_workers = [0]
accumulation_steps = [1]
compile = ["off"]
intra_op_threads = [0, 1]
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--grid-passes", type=int, default=2)
    args = parser.parse_args()
    cores = partition.machine_cores()
    shares = partition.plan(args.jobs, cores, [])
    rates: dict[int, float] = {}
    whole: dict[int, float] = {}
    parallel = None
    with tempfile.TemporaryDirectory(prefix="knobtune-jobs-") as tmp:
        for jobs in (1, args.jobs):
            text = study_text(f"jobs-{jobs}", "pytorch", args.trials, 0, SPACE)
            url = f"sqlite:///{Path(tmp) / f'jobs-{jobs}.db'}"
            print(f"1. --jobs {jobs}: {args.trials} trials", flush=True)
            study, wall = run_study(text, url, jobs=str(jobs))
            measured = [t for t in study.trials if TrialRecord.of(t).outcome]
            phase = (max(t.datetime_complete for t in measured) - min(t.datetime_start for t in measured))
            rates[jobs] = len(measured) / phase.total_seconds() * 60
            whole[jobs] = len(measured) / wall * 60
            print(f"   {len(measured)} trials in {phase.total_seconds():.0f} s of trials ({rates[jobs]:.1f} trials/minute), "
                  f"{wall:.0f} s in all ({whole[jobs]:.1f} trials/minute)", flush=True)
            if jobs > 1:
                parallel = study
                for t in measured:
                    share, placed = TrialRecord.of(t).partition or {}, TrialRecord.of(t).placement or {}
                    print(f"   trial #{t.number:<3} share {share.get('index')} cores {share.get('cores')}: "
                          f"its child ran on {placed.get('affinity')}")
        print(f"--jobs {args.jobs} / --jobs 1: {rates[args.jobs] / rates[1]:.2f}x trials per minute over the trials "
              f"(expect 1.6x or more with 2 jobs on 2 cores; the baseline runs alone, its seeds side by side), "
              f"{whole[args.jobs] / whole[1]:.2f}x over the whole run")
        assert parallel is not None
        plan = plan_for(study_text("grid", "pytorch", args.trials, 0, SPACE), shares[0])
        grid = list(plan.space.grid(plan.offer))
        varying = [k for k, v in plan.offer.choices.items() if len(v) > 1]

        def key(params: dict[str, Any]) -> tuple:
            return tuple(sorted((k, v) for k, v in params.items() if k in varying))

        print(f"2. the grid on share 0 (cores {list(shares[0].cores)}): {len(grid)} configurations, "
              f"{args.grid_passes} passes", flush=True)
        runs: dict[tuple, list[tuple[float, float]]] = {key(p): [] for p in grid}
        for rep in range(args.grid_passes):
            for i, params in enumerate(grid):
                r = run_params(plan, params, f"{rep + 1}:{i + 1}/{len(grid)}", seed_offset=rep)
                runs[key(params)].append((r.samples_per_second or 0.0, r.val_accuracy or 0.0))
        base = plan.space.baseline_params(plan.offer, plan.ctx, plan.definition.baseline)
        floor = final_floor([acc for _, acc in runs[key(base)]], plan.definition.guard.max_accuracy_drop)
        table = grid_table(runs)
        feasible = {k: v[0] for k, v in table.items() if v[1] >= floor}
        winner = results.best(parallel)
        found = feasible.get(key(winner.params), 0.0) if winner is not None else 0.0
        best_key = max(feasible, key=feasible.get)
        print(f"found (trial #{winner.number if winner else '-'}: {dict(key(winner.params)) if winner else '-'}) / "
              f"grid best ({dict(best_key)}) on one share: {found / feasible[best_key]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
