"""The hooks' cost of benchmarks/trainer_libraries.py, shared by its per-framework measurers
(_hooks_pytorch.py, _hooks_tensorflow.py), which run in processes of their own: torch and
TensorFlow never share one. Imports neither framework.

    .venv/bin/python benchmarks/_hooks_pytorch.py hf|lightning [--rounds 12] [--steps 60]
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "studies"))

WARMUP_STEPS = 10

Round = Callable[[int], tuple[Callable[[], float], Callable[[], float]]]  # steps -> (without, with knobtune)


class Clock:
    """Step-end times; the rate over the steps after the warm-up."""

    def __init__(self, batch: int) -> None:
        self.batch, self.times = batch, []

    def tick(self) -> None:
        self.times.append(time.perf_counter())

    def rate(self) -> float:
        timed = self.times[WARMUP_STEPS:]
        return (len(timed) - 1) * self.batch / (timed[-1] - timed[0])


def cost(name: str, make: Round, rounds: int,
         steps: int) -> None:
    without, with_kt = make(steps)
    without(), with_kt()  # one untimed round each: imports, first allocations
    ratios, rates = [], {"without": [], "with": []}
    for i in range(rounds):
        pair = (("without", without), ("with", with_kt)) if i % 2 == 0 else (("with", with_kt), ("without", without))
        got = {label: fn() for label, fn in pair}
        rates["without"].append(got["without"])
        rates["with"].append(got["with"])
        ratios.append(got["with"] / got["without"])
    q = statistics.quantiles(ratios, n=4)
    print(f"{name}: hooks' cost over {rounds} paired rounds of {steps} steps: with/without = "
          f"{statistics.median(ratios):.3f} (quartiles {q[0]:.3f}-{q[2]:.3f}); medians "
          f"{statistics.median(rates['with']):.0f} vs {statistics.median(rates['without']):.0f} samples/s "
          f"(target >= 0.98)", flush=True)



def main(rounds: dict[str, tuple[str, Round, int]]) -> int:
    """One library's cost: ``rounds`` maps its key to (name, round maker, default steps)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("library", choices=tuple(rounds))
    parser.add_argument("--rounds", type=int, default=12, help="paired rounds (default 12)")
    parser.add_argument("--steps", type=int, help="optimizer steps per round (default: the library's)")
    args = parser.parse_args()
    os.environ.pop("KNOBTUNE_CONFIG", None)
    os.environ.setdefault("KNOBTUNE_WATCHDOG_S", "30")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    warnings.filterwarnings("ignore")
    for quiet in ("lightning.pytorch", "lightning.fabric", "transformers", "knobtune", "tensorflow"):
        logging.getLogger(quiet).setLevel(logging.ERROR)
    name, make, steps = rounds[args.library]
    cost(name, make, args.rounds, args.steps or steps)
    return 0
