"""What does the Tuned API cost a production loop? The same training loop written by hand and
through the API (``kt.batches``, ``kt.autocast``, ``kt.backward``: the watchdog's host clock read
and the NaN guard's device op per step), with identical settings, side by side.

The shortest step this machine has (in-memory data, a 784-64-10 MLP, one intra-op thread), so
whatever the API adds per step shows. The two loops alternate rounds of one pass over the same
data (who goes first alternates too) in one process; the ratio is the median over rounds of
rate(API) / rate(by hand). Target: >= 0.98.

    .venv/bin/python benchmarks/api_overhead.py [--rounds 30] [--samples 8192]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30, help="alternating rounds per loop (default 30)")
    parser.add_argument("--samples", type=int, default=8192, help="samples per round (default 8192)")
    args = parser.parse_args()
    os.environ.pop("KNOBTUNE_CONFIG", None)

    import torch
    from torch.utils.data import DataLoader

    from knobtune.trainers.common.production import WatchdogSettings
    from knobtune.trainers.pytorch.tuned import Tuned

    from bench_workloads import fast_step

    torch.set_num_threads(1)
    workload = fast_step(samples=args.samples)
    batch = workload.batch_size
    loss_fn = workload.loss_fn

    def make() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = workload.build_model()
        return model, workload.build_optimizer(model.parameters())

    # by hand: what a user writes today
    hand_model, hand_opt = make()
    hand_loader = DataLoader(workload.train_dataset, batch_size=batch, shuffle=True)

    def by_hand() -> int:
        seen = 0
        for x, y in hand_loader:
            loss = loss_fn(hand_model(x), y)
            hand_opt.zero_grad(set_to_none=True)
            loss.backward()
            hand_opt.step()
            seen += len(y)
        return seen

    # the same loop through the API, in production (the defaults: the script's own settings)
    kt = Tuned({}, role="default", settings=WatchdogSettings(interval_s=5.0))
    api_model, api_opt = make()
    api_loader = kt.dataloader(workload.train_dataset, batch_size=batch, shuffle=True)
    trained = kt.prepare(api_model)

    def through_api() -> int:
        seen = 0
        for x, y in kt.batches(api_loader):
            with kt.autocast():
                loss = loss_fn(trained(x), y)
            kt.backward(loss, api_opt)
            seen += len(y)
        return seen

    loops = {"by hand": by_hand, "Tuned API": through_api}

    def rate(name: str) -> float:
        start = time.perf_counter()
        seen = loops[name]()
        return seen / (time.perf_counter() - start)

    for name in loops:  # warm both up: allocator, caches, optimizer state
        rate(name)
    rates: dict[str, list[float]] = {name: [] for name in loops}
    ratios = []
    for r in range(args.rounds):
        order = list(loops) if r % 2 == 0 else list(reversed(loops))
        measured = {name: rate(name) for name in order}
        for name, value in measured.items():
            rates[name].append(value)
        ratios.append(measured["Tuned API"] / measured["by hand"])
    step_us = 1e6 * batch / statistics.median(rates["by hand"])
    for name in loops:
        print(f"{name:<10} {statistics.median(rates[name]):>9,.0f} samples/s (median of {args.rounds} rounds)")
    quartiles = statistics.quantiles(ratios, n=4)
    print(f"a step by hand: {step_us:.0f} us; the watchdog closed {len(kt.driver.watchdog.intervals)} intervals")
    print(f"Tuned API / by hand: median {statistics.median(ratios):.3f} over {len(ratios)} paired rounds "
          f"(quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f}); target >= 0.98")
    return 0


if __name__ == "__main__":
    sys.exit(main())
