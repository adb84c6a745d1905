"""Does the search find what an exhaustive grid finds, and what does the tool cost per trial?

One run on this machine, on digits-mlp (PyTorch):
  1. the exhaustive grid over batch_size x num_workers x amp x intra_op_threads (other knobs default);
  2. a knobtune study of 20 trials over the same space (baseline and the seeds' advice first);
  3. baseline, grid-best and search-best re-measured side by side, interleaved, 3 times each;
  4. eight of the grid's configurations measured as children forked from the warm server and as
     fresh processes, alternately.
Prints best/baseline and found/grid-best as ratios, and the overhead per trial (trial wall time
minus the burst's own time) as a fraction of the trial, for the study (warm server) and for both
ways side by side. Not a test: numbers vary with the machine.

    .venv/bin/python benchmarks/search_vs_grid.py [--trials 20] [--repeats 3]
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from knobtune.search.storage.record import TrialRecord

from _bench import arguments, interleaved, median, overhead, plan_for, run_params, run_study, space_lines, study_text

SPACE = "\n" + space_lines("pytorch", {"batch_size": [32, 64, 128, 256], "num_workers": [0, 1, 2], "amp": ["off", "bf16"],
                                        "intra_op_threads": [0, 1], "persistent_workers": [True]})


def main() -> int:
    args = arguments(__doc__, trials=20)
    text = study_text("bench-digits-mlp", "pytorch", args.trials, args.seed, SPACE)
    plan = plan_for(text)
    space, offer, guard = plan.space, plan.offer, plan.definition.guard.max_accuracy_drop

    print("1. exhaustive grid", flush=True)
    grid = list(space.grid(offer))
    baseline_params = space.baseline_params(offer, plan.ctx, plan.definition.baseline)
    base = run_params(plan, baseline_params, "baseline")
    floor = (base.val_accuracy or 0) - guard
    grid_results = [(params, run_params(plan, params, f"grid {i + 1}/{len(grid)}")) for i, params in enumerate(grid)]
    feasible = [(p, r) for p, r in grid_results if r.outcome == "ok" and (r.val_accuracy or 0) >= floor]
    grid_best_params, grid_best = max(feasible, key=lambda pr: pr[1].samples_per_second or 0)

    print(f"\n2. knobtune search, {args.trials} trials", flush=True)
    from knobtune.search.story import results

    with tempfile.TemporaryDirectory() as tmp:
        study, search_wall = run_study(text, f"sqlite:///{Path(tmp) / 'bench.db'}")
        best = results.best(study)
        done = results.finished(study)
        # (trials measured to the end: a pruned trial has a wall time but no burst time)
        measured = [r for r in map(TrialRecord.of, done) if r.trial_seconds and r.burst_seconds]
        trial_s = sum(r.trial_seconds for r in measured)  # type: ignore[misc]
        burst_s = sum(r.burst_seconds for r in measured)  # type: ignore[misc]
        search_best_params = dict(best.params)
        search_rank = 1 + sum(1 for _, r in feasible if (r.samples_per_second or 0) > TrialRecord.of(best).samples_per_second)

    print(f"\n3. side by side, interleaved, {args.repeats} repeats", flush=True)
    rates = interleaved({"baseline": (plan, baseline_params), "grid-best": (plan, grid_best_params),
                         "search-best": (plan, search_best_params)}, args.repeats)
    b, g, s = (median(rates[k]) for k in ("baseline", "grid-best", "search-best"))

    print("\n4. overhead: warm server and fresh process, alternately", flush=True)
    ways = overhead(plan, grid[::max(1, len(grid) // 8)][:8])

    print("\n=== search vs grid on digits-mlp (pytorch), this machine ===")
    print(f"grid: {len(grid)} configurations, {len(feasible)} pass the accuracy guard (>= {floor:.3f})")
    print(f"grid best:    {grid_best_params}")
    print(f"search best:  {search_best_params} (trial #{best.number}; rank {search_rank} of the grid's feasible configs "
          f"by the grid's own single measurements)")
    print(f"side-by-side medians (samples/s): baseline {b:,.0f}   grid-best {g:,.0f}   search-best {s:,.0f}")
    print(f"best/baseline        = {s / b:.2f}x   (grid-best/baseline = {g / b:.2f}x)")
    print(f"found/grid-best      = {s / g:.2f}")
    print(f"overhead per trial   = {(trial_s - burst_s) / trial_s:.0%} of trial wall time "
          f"({(trial_s - burst_s) / len(measured):.1f} s of {trial_s / len(measured):.1f} s: the study, warm server; child start, "
          f"data setup, evaluation)")
    for way, (fraction, seconds) in ways.items():
        print(f"  {way:<18} = {fraction:.0%} of trial wall time ({seconds:.1f} s per trial), side by side")
    fresh, warm = ways["fresh process"][1], ways["warm server"][1]
    print(f"  overhead fresh/warm = {fresh / warm:.1f}x")
    print(f"search wall time     = {search_wall:.0f} s for {len(done)} trials")
    return 0


if __name__ == "__main__":
    sys.exit(main())
