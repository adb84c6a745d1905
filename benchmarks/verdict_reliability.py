"""How reliably confirmation's final accuracy verdict keeps a configuration, on a grid's measured
accuracies: with the rounds it runs, and with the extra rounds it runs for a close call.

A grid file (search_quality.py's --grid-file, benchmarks/grids/) holds each configuration's
accuracy in several seeded passes. One draw plays a confirmation of a fast candidate against the
baseline: the baseline's trial runs (--baseline-runs) and --rounds rounds of each, every accuracy
drawn with replacement from the configuration's measured ones; the verdict is knobtune's (the
candidate's mean against the mean of every baseline accuracy minus --max-drop), and when
``_close_calls`` finds the candidate within the rounds' uncertainty of the floor, as many rounds
again are drawn and the verdict is taken over all of them. Prints, per configuration at or above
--min-batch, its mean accuracy over the grid (against the grid's own floor) and how often each
verdict keeps it, with how often the extension ran. Speed plays no part: every candidate here is
taken to beat the baseline.

    .venv/bin/python benchmarks/verdict_reliability.py benchmarks/grids/pytorch-small.json [--draws 2000]
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

from _bench import grid_baseline, grid_runs

from knobtune.search.study.confirm import _close_calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("grids", type=Path, nargs="+")
    parser.add_argument("--draws", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5, help="confirmation rounds (noisy_repeats' default, 5)")
    parser.add_argument("--baseline-runs", type=int, default=2, help="[guard] baseline_runs' default, 2")
    parser.add_argument("--max-drop", type=float, default=0.02, help="[guard] max_accuracy_drop's default")
    parser.add_argument("--min-batch", type=int, default=256, help="only configurations with a batch this large")
    args = parser.parse_args()
    for path in args.grids:
        data = json.loads(path.read_text())
        runs, top = grid_runs(data["runs"]), grid_runs(data.get("top", []))
        base = grid_baseline(data["framework"], runs)
        base_accs = [a for _, a in runs[base]]
        grid_floor = statistics.fmean(base_accs) - args.max_drop
        print(f"{path} ({data['framework']}, measured {data.get('measured', {}).get('date', '?')}): baseline "
              f"{dict(base)}, grid floor {grid_floor:.4f}")
        for config in sorted(runs, key=lambda k: -statistics.fmean(a for _, a in runs[k])):
            accs = [a for rate, a in runs[config] + top.get(config, []) if rate > 0]
            if not accs or config == base or dict(config)["batch_size"] < args.min_batch:
                continue
            rng = random.Random(0)
            kept = kept_extended = extended = 0
            for _ in range(args.draws):
                trial_base = [rng.choice(base_accs) for _ in range(args.baseline_runs)]
                mine = [rng.choice(accs) for _ in range(2 * args.rounds)]
                theirs = [rng.choice(base_accs) for _ in range(2 * args.rounds)]

                def verdict(n: int) -> tuple[bool, float]:
                    floor = statistics.fmean(trial_base + theirs[:n]) - args.max_drop
                    return statistics.fmean(mine[:n]) >= floor, floor

                first, floor = verdict(args.rounds)
                table = {"1": [{"value": 2.0, "val_accuracy": a} for a in mine[:args.rounds]],
                         "0": [{"value": 1.0, "val_accuracy": a} for a in theirs[:args.rounds]]}
                close = _close_calls(table, 0, [1], floor, False, 0.03)
                kept += first
                extended += bool(close)
                kept_extended += verdict(2 * args.rounds)[0] if close else first
            mean = statistics.fmean(accs)
            print(f"  {dict(config)}: mean accuracy {mean:.4f} ({'at or above' if mean >= grid_floor else 'under'} "
                  f"the grid's floor); kept by {args.rounds} rounds {kept / args.draws:.0%}, with the extension "
                  f"{kept_extended / args.draws:.0%} (it ran in {extended / args.draws:.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
