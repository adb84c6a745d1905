"""Data-parallel trials ([study] nproc = 2) on this machine: 2 gloo ranks, one core each.

1. A digits-mlp study of 2-rank trials (DDP's knobs and the per-rank loader and thread knobs
   searched), confirmation on: the confirmed median of the winner against the baseline (DDP's
   default settings, the script's loader), and the scaling figure the study reports.
2. The winner against the winner with DistributedDataParallel's default settings, interleaved
   (what the DDP knobs alone buy).
3. Scaling: the baseline as 2 ranks and as one rank alone on one rank's core (the same per-rank
   configuration), back to back as the study measures it, repeated: the group's samples/s over one
   rank's, and the efficiency (that over 2).

On a CPU the figures say what gloo over loopback and two cores sharing caches and memory bandwidth
cost; they say nothing about NCCL over NVLink, where bucket size and compression matter differently.

    .venv/bin/python benchmarks/data_parallel.py [--trials 12] [--repeats 5] [--seed 0]
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from knobtune.search.launch import partition
from knobtune.search.launch.probe import probe
from knobtune.search.storage.record import StudyRecord
from knobtune.search.story import results
from knobtune.search.study import definition, scaling
from knobtune.search.study.objective import Plan
from knobtune.spaces import for_framework
from knobtune.spaces.pytorch import DDP_KNOBS

from _bench import arguments, interleaved, median, run_study, study_text

SPACE = """batch_size = [64, 128]
accumulation_steps = [1]
compile = ["off"]
amp = ["off", "bf16"]
num_workers = [0, 1]
ddp_bucket_cap_mb = [5, 25, 100]
ddp_gradient_as_bucket_view = [false, true]
ddp_static_graph = [false, true]
ddp_comm_hook = ["none", "fp16"]
"""


def group_plan(text: str) -> Plan:
    """The plan of a 2-rank study, probed as the run probes it: on one rank's share."""
    d = definition.parse(text, default_name="benchmark")
    cores = partition.machine_cores()
    whole = partition.Partition(0, tuple(cores))
    rank0 = partition.Partition(0, partition.rank_shares(cores, 2)[0])
    info = probe(d.study.framework, d.study.workload, d.workload, placement=rank0, nproc=2)
    ctx = {"hardware": info["fingerprint"]["hardware"], "workload": info["workload"]}
    space = for_framework("pytorch")
    return Plan(d, space, space.offer(ctx, d.space, d.baseline), ctx, ".", whole, nproc=2)


def main() -> int:
    args = arguments(__doc__, trials=12)
    if len(partition.physical_groups(partition.machine_cores())) < 2:
        print("skipped: two ranks need two physical cores")
        return 0
    text = study_text("data-parallel", "pytorch", args.trials, args.seed, SPACE).replace(
        "seed = ", "nproc = 2\nseed = ", 1)
    with tempfile.TemporaryDirectory(prefix="knobtune-dp-") as tmp:
        print(f"1. a 2-rank study, {args.trials} trials, confirmation on", flush=True)
        study, wall = run_study(text, f"sqlite:///{Path(tmp) / 'dp.db'}", confirm=True)
        kept = StudyRecord.of(study)
        confirmed = kept.confirmed or {}
        winner = results.best(study)
        if confirmed.get("speedup"):
            low, high = confirmed["speedup_range"]
            print(f"   {wall:.0f} s; confirmed: trial #{confirmed['winner']} is {confirmed['speedup']:.2f}x the "
                  f"baseline "
                  f"(paired median; range {low:.2f}x-{high:.2f}x)")
        else:
            close = confirmed.get("runner_up") or {}
            print(f"   {wall:.0f} s; confirmed: the baseline is kept (closest: trial #{close.get('trial')} at "
                  f"{close.get('speedup') or 0:.2f}x)")
        if kept.scaling:
            for label in ("baseline", "winner"):
                s = kept.scaling[label]
                if "efficiency" in s:
                    print(f"   the study's scaling, {label}: {s['speedup']:.2f}x one rank, "
                          f"{100 * s['efficiency']:.0f}% efficiency")
    plan = group_plan(text)
    assert winner is not None
    best = dict(winner.params)
    ddp_default = {**best, **{k: for_framework("pytorch").knob(k).default for k in DDP_KNOBS if k in best}}
    print(f"2. the winner {best} against its DDP defaults, {args.repeats} interleaved rounds", flush=True)
    rates = interleaved({"winner": (plan, best), "ddp-default": (plan, ddp_default)}, args.repeats)
    ratios = [w / d for w, d in zip(rates["winner"], rates["ddp-default"])]
    print(f"winner / DDP defaults: {median(ratios):.2f}x (rounds {', '.join(f'{r:.2f}' for r in ratios)})")
    base = plan.space.baseline_params(plan.offer, plan.ctx, plan.definition.baseline)
    print(f"3. the baseline as 2 ranks and as 1 rank alone, back to back, {args.repeats} times", flush=True)
    rounds = []
    for r in range(args.repeats):
        figure = scaling.paired(plan, base)  # as the study measures it: the group, then one rank alone
        print(f"  [{r}] {figure}", flush=True)
        if "speedup" in figure:
            rounds.append(figure)
    pairs = [f["speedup"] for f in rounds]
    print(f"2 ranks / 1 rank: {median(pairs):.2f}x (rounds {', '.join(f'{p:.2f}' for p in pairs)}); "
          f"scaling efficiency {median(pairs) / 2:.0%}; 1 rank {median(f['one_rank'] for f in rounds):,.0f} samples/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
