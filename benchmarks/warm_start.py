"""Warm start: does a second model on this box reach a good configuration in fewer trials when its
study starts from what the first model's study learned?

One run on this machine, on digits-mlp (PyTorch) at two batch sizes, the "first model" trained at
small batches (32 or 64) and the "second model" at large ones (128 or 256):
  1. the exhaustive grid of the second model's space (batch_size x num_workers x amp x
     intra_op_threads), one pass: the reference table;
  2. the first model's study (with confirmation of its winner);
  3. the second model's study twice with the same seed and trial budget: from scratch, and with
     ``warm_start = ["first model"]`` (the first's winner and top trials queued after the baseline,
     their batch sizes clipped to 128/256).
Every trial is scored by the grid's measurement of its configuration (0 when below the grid's
accuracy guard), so both searches are judged on what they chose, not on their own measurements.
Prints trials to reach 95 % of the grid best with and without the warm start, and their ratio.

    .venv/bin/python benchmarks/warm_start.py [--trials 12] [--seed 0]
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from knobtune.search.storage.record import TrialRecord

from _bench import arguments, plan_for, run_params, run_study, space_lines, study_text

SEARCHED = {"num_workers": [0, 2], "amp": ["off", "bf16"], "intra_op_threads": [0, 1]}


FIRST = "batch_size = [32, 64]\n" + space_lines("pytorch", SEARCHED)
SECOND = "batch_size = [128, 256]\n" + space_lines("pytorch", SEARCHED)


def second_text(name: str, trials: int, seed: int, warm: bool) -> str:
    """The second model's study: batch 128 as its baseline, optionally warm-started from the first."""
    text = study_text(name, "pytorch", trials, seed, SECOND).replace("batch_size = 64\n", "batch_size = 128\n", 1)
    return text.replace("[burst]", 'warm_start = ["first-model"]\n\n[burst]', 1) if warm else text


def main() -> int:
    args = arguments(__doc__, trials=12)
    plan = plan_for(second_text("grid", args.trials, args.seed, warm=False))
    space, offer = plan.space, plan.offer

    def key(params: dict[str, Any]) -> tuple:
        return tuple(sorted((k, v) for k, v in params.items() if len(offer.choices.get(k, ())) > 1))

    grid = list(space.grid(offer))
    print(f"1. exhaustive grid of the second model's space: {len(grid)} configurations", flush=True)
    base = run_params(plan, space.baseline_params(offer, plan.ctx, plan.definition.baseline), "baseline")
    floor = (base.val_accuracy or 0) - plan.definition.guard.max_accuracy_drop
    table = {}
    for i, params in enumerate(grid):
        r = run_params(plan, params, f"grid {i + 1}/{len(grid)}")
        table[key(params)] = (r.samples_per_second or 0.0) if r.outcome == "ok" and (r.val_accuracy or 0) >= floor else 0.0
    grid_best = max(table.values())

    def to_95(study: Any) -> int | None:
        """Measured trials, in order, until one's grid score reaches 95 % of the grid best."""
        measured = [t for t in sorted(study.trials, key=lambda t: t.number) if TrialRecord.of(t).outcome]
        for i, t in enumerate(measured, start=1):
            if table.get(key(t.params), 0.0) >= 0.95 * grid_best:
                return i
        return None

    reach: dict[str, int | None] = {}
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'warm.db'}"
        print(f"\n2. the first model's study (batch 32/64), {args.trials} trials", flush=True)
        run_study(study_text("first-model", "pytorch", args.trials, args.seed, FIRST), url, confirm=True)
        for label, warm in (("from scratch", False), ("warm start", True)):
            print(f"\n3. the second model's study (batch 128/256), {label}, {args.trials} trials", flush=True)
            study, _ = run_study(second_text(f"second-{'warm' if warm else 'cold'}", args.trials, args.seed, warm), url)
            reach[label] = to_95(study)

    def fmt(value: int | None) -> str:
        return f"{value} trials" if value is not None else f"not within {args.trials} trials"

    cold, warm = reach["from scratch"], reach["warm start"]
    print(f"\n=== warm start on digits-mlp (pytorch), this machine: batch 32/64 -> 128/256; {len(grid)} configurations, "
          f"grid best {grid_best:,.0f} samples/s ===")
    print(f"trials to 95% of grid best   from scratch {fmt(cold)}   warm start {fmt(warm)}")
    if cold is not None and warm is not None:
        print(f"from scratch / warm start  = {cold / warm:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
