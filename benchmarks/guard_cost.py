"""What does the NaN/Inf guard cost? The same training loop with the guard on and off, side by side.

The guard copies each step's loss into a preallocated device buffer (one small op) and checks a
window's slice at its boundary. This measures it on the shortest step this machine has (in-memory data, a small MLP,
one intra-op thread): two trainers built from the same request but for the guard, in one process,
alternate rounds of the same number of steps (each round closes with a window boundary: sync and
guard read), so process-to-process and minute-to-minute drift hit both alike. The ratio is the
median over rounds of rate(on) / rate(off). Target: >= 0.99.

    .venv/bin/python benchmarks/guard_cost.py [--rounds 40] [--steps 300]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from knobtune.spaces import for_framework  # noqa: E402

# every knob at its CPU default, batch 64, one intra-op thread
KNOBS = {**for_framework("pytorch").defaults({"hardware": {"cuda": False, "usable_cores": 2},
                                              "workload": {"batch_size": 64}}), "intra_op_threads": 1}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40, help="alternating rounds per trainer (default 40)")
    parser.add_argument("--steps", type=int, default=300, help="training steps per round (default 300)")
    args = parser.parse_args()

    from knobtune.trainers.common.wire import Burst, Request
    from knobtune.trainers.pytorch.loops import LossGuard
    from knobtune.trainers.pytorch.tuned import for_request
    from knobtune.trainers.pytorch.workload import load

    total = args.rounds * args.steps + 200
    burst = Burst(train_samples=total * KNOBS["batch_size"], warmup_samples=0, windows=1)
    workload = load("bench_workloads:fast_step")
    setups = {}
    for guard in (True, False):  # the same calls the built-in loop makes, through the integration API
        kt = for_request(Request(knobs=KNOBS, burst=burst, guard=guard))
        loader = kt.dataloader(workload.train_dataset, shuffle=True, collate_fn=workload.collate_fn)
        model = workload.build_model()
        trained, optimizer = kt.prepare(model, workload.build_optimizer(model.parameters()))
        kt.guard = LossGuard(total, kt.device)
        setups[guard] = (kt, kt.driver.endless(loader, total), trained, optimizer)
    steps = {True: 0, False: 0}

    def run(guard: bool, count: int) -> float:
        kt, batches, trained, optimizer = setups[guard]
        start = time.perf_counter()
        for _ in range(count):
            inputs, targets = next(batches)
            kt.step_index = steps[guard]
            with kt.autocast():
                loss = workload.loss_fn(trained(inputs), targets)
            kt.backward(loss, optimizer)
            steps[guard] += 1
        reading = kt.driver.checkpoint()
        assert reading.finite
        return count * KNOBS["batch_size"] / (time.perf_counter() - start)

    for guard in (True, False):  # warm both up: allocator, caches, optimizer state
        run(guard, 100)
    ratios, rates = [], {True: [], False: []}
    for r in range(args.rounds):
        order = (True, False) if r % 2 == 0 else (False, True)  # neither always goes first
        measured = {guard: run(guard, args.steps) for guard in order}
        ratios.append(measured[True] / measured[False])
        for guard, value in measured.items():
            rates[guard].append(value)
    step_us = 1e6 * KNOBS["batch_size"] / statistics.median(rates[False])
    print(f"guard on  {statistics.median(rates[True]):>9,.0f} samples/s (median of {args.rounds} rounds of "
          f"{args.steps} steps)")
    print(f"guard off {statistics.median(rates[False]):>9,.0f} samples/s (a step: {step_us:.0f} us)")
    quartiles = statistics.quantiles(ratios, n=4)
    print(f"guard on / guard off: median {statistics.median(ratios):.3f} over {len(ratios)} paired rounds "
          f"(quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f}); target >= 0.99")
    return 0


if __name__ == "__main__":
    sys.exit(main())
