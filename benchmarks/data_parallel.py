"""Data-parallel trials ([study] nproc = 2) on this machine: PyTorch's 2 gloo ranks, one core
each, or TensorFlow's 2 MirroredStrategy replicas on two logical CPU devices in one process.

1. A digits-mlp study of 2-rank (2-replica) trials (the data-parallel knobs and the loader, pipeline
   and thread knobs searched), confirmation on: the confirmed median of the winner against the
   baseline (the framework's default data-parallel settings), and the scaling figure it reports.
2. The winner against the winner with the framework's default data-parallel settings (DDP's, or
   MirroredStrategy's own all-reduce), interleaved: what those knobs alone buy.
3. Scaling: the baseline as the group and as one rank (replica) alone, back to back as the study
   measures it, repeated: the group's samples/s over one's, and the efficiency (that over 2).

On a CPU the figures say what gloo over loopback, or TensorFlow's all-reduce between logical
devices, and two cores sharing caches and memory bandwidth cost; they say nothing about NCCL over
NVLink, where bucket size, compression and the all-reduce matter differently. TensorFlow's logical
CPU devices share the process's cores: two replicas add no compute.

    .venv/bin/python benchmarks/data_parallel.py [--framework pytorch|tensorflow] [--trials 12]
        [--repeats 5] [--seed 0]
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

SPACES = {"pytorch": """batch_size = [64, 128]
accumulation_steps = [1]
compile = ["off"]
amp = ["off", "bf16"]
num_workers = [0, 1]
ddp_bucket_cap_mb = [5, 25, 100]
ddp_gradient_as_bucket_view = [false, true]
ddp_static_graph = [false, true]
ddp_comm_hook = ["none", "fp16"]
""", "tensorflow": """batch_size = [64, 128]
accumulation_steps = [1]
mixed_precision = ["float32", "mixed_bfloat16"]
map_parallel_calls = [0, 2, "autotune"]
prefetch = [0, "autotune"]
steps_per_execution = [1, 4]
cross_device_ops = ["collective", "reduction_to_one_device", "hierarchical_copy"]
"""}
# the knobs a data-parallel group adds, held at their defaults for "the framework's defaults"
GROUP_KNOBS = {"pytorch": DDP_KNOBS, "tensorflow": ("cross_device_ops",)}


def group_plan(text: str) -> Plan:
    """The plan of a 2-rank (2-replica) study, probed as the run probes it: on one rank's share
    (TensorFlow's replicas: on the whole, their one process's)."""
    d = definition.parse(text, default_name="benchmark")
    cores = partition.machine_cores()
    whole = partition.Partition(0, tuple(cores))
    probed = whole if d.study.members == "replicas" else partition.Partition(0, partition.rank_shares(cores, 2)[0])
    info = probe(d.study.framework, d.study.workload, d.workload, placement=probed, nproc=2)
    ctx = {"hardware": info["fingerprint"]["hardware"], "workload": info["workload"]}
    space = for_framework(d.study.framework)
    return Plan(d, space, space.offer(ctx, d.space, d.baseline), ctx, ".", whole, nproc=2)


def main() -> int:
    args = arguments(__doc__, trials=12, frameworks=("pytorch", "tensorflow"))
    framework = args.framework
    one = "replica" if framework == "tensorflow" else "rank"
    if len(partition.physical_groups(partition.machine_cores())) < 2:
        print(f"skipped: two {one}s need two physical cores")
        return 0
    text = study_text("data-parallel", framework, args.trials, args.seed, SPACES[framework]).replace(
        "seed = ", "nproc = 2\nseed = ", 1)
    with tempfile.TemporaryDirectory(prefix="knobtune-dp-") as tmp:
        print(f"1. a {framework} study of 2-{one} trials, {args.trials} trials, confirmation on", flush=True)
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
                    print(f"   the study's scaling, {label}: {s['speedup']:.2f}x one {one}, "
                          f"{100 * s['efficiency']:.0f}% efficiency")
    plan = group_plan(text)
    assert winner is not None
    best = dict(winner.params)
    space = for_framework(framework)
    default = {**best, **{k: space.knob(k).default for k in GROUP_KNOBS[framework] if k in best}}
    values = space.resolve(default, plan.offer, plan.ctx)
    refused = plan.space.invalid({k: r.value for k, r in values.items()}, plan.ctx)
    if refused and framework == "tensorflow":  # (the collective all-reduce cannot run several steps per call here)
        print(f"2. its data-parallel defaults cannot run here ({refused}): the winner against the other all-reduces")
        others = [o for o in plan.offer.choices.get("cross_device_ops", []) if o != best.get("cross_device_ops")
                  and not plan.space.invalid({**{k: r.value for k, r in values.items()}, "cross_device_ops": o},
                                             plan.ctx)]
        default = {**best, "cross_device_ops": others[0]} if others else None
    if default is None:
        print("   no other configuration of the data-parallel knobs runs here")
    else:
        changed = {k: default[k] for k in default if default[k] != best.get(k)}
        print(f"2. the winner {best} against it with {changed}, {args.repeats} interleaved rounds", flush=True)
        rates = interleaved({"winner": (plan, best), "group-default": (plan, default)}, args.repeats)
        ratios = [w / d for w, d in zip(rates["winner"], rates["group-default"])]
        print(f"winner / it with {changed}: {median(ratios):.2f}x (rounds {', '.join(f'{r:.2f}' for r in ratios)})")
    base = plan.space.baseline_params(plan.offer, plan.ctx, plan.definition.baseline)
    print(f"3. the baseline as 2 {one}s and as 1 {one} alone, back to back, {args.repeats} times", flush=True)
    rounds = []
    for r in range(args.repeats):
        figure = scaling.paired(plan, base)  # as the study measures it: the group, then one alone
        print(f"  [{r}] {figure}", flush=True)
        if "speedup" in figure:
            rounds.append(figure)
    pairs = [f["speedup"] for f in rounds]
    print(f"2 {one}s / 1 {one}: {median(pairs):.2f}x (rounds {', '.join(f'{p:.2f}' for p in pairs)}); "
          f"scaling efficiency {median(pairs) / 2:.0%}; 1 {one} {median(f['one_rank'] for f in rounds):,.0f} samples/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
