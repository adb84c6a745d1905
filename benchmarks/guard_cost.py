"""What does the NaN/Inf guard cost? The same burst with the guard on and off, side by side.

The guard keeps each step's loss tensor (no device op) and checks a window's losses at its
boundary. This measures it on the shortest step this machine has (in-memory data, a small MLP,
one intra-op thread so that the two runs do not fight over cores), interleaved on/off pairs;
the ratio is the median over the pairs of rate(on) / rate(off). Target: >= 0.99.

    .venv/bin/python benchmarks/guard_cost.py [--repeats 7]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from search.runner import run_child  # noqa: E402

KNOBS = {"batch_size": 64, "accumulation_steps": 1, "num_workers": 0, "prefetch_factor": 2,
         "persistent_workers": False, "intra_op_threads": 1, "pin_memory": False, "amp": "off",
         "compile": "off", "channels_last": False, "cudnn_benchmark": False, "cudnn_deterministic": False}
BURST = {"train_samples": 96000, "warmup_samples": 6400, "windows": 5, "seed": 0}


def rate(guard: bool) -> tuple[float, float]:
    child = run_child("pytorch", "burst", {"workload": "bench_workloads:fast_step", "knobs": KNOBS, "burst": BURST,
                                           "guard": guard, "workdir": str(HERE)}, 600)
    if child.outcome != "ok":
        raise SystemExit(f"guard={guard}: {child.outcome}: {child.failure}")
    steps = sum(child.data["window_samples"]) / KNOBS["batch_size"]
    return child.data["samples_per_second"], sum(child.data["window_seconds"]) / steps * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7, help="on/off pairs (default 7)")
    args = parser.parse_args()
    ratios = []
    for r in range(args.repeats):
        # alternate which runs first, so that a drift of the machine favours neither
        order = (True, False) if r % 2 == 0 else (False, True)
        measured = {guard: rate(guard) for guard in order}
        (on, step_us), (off, _) = measured[True], measured[False]
        ratios.append(on / off)
        print(f"  pair {r + 1}: guard on {on:>9,.0f} samples/s, off {off:>9,.0f}  ratio {on / off:.3f}  "
              f"(a step: {step_us:.0f} us)", flush=True)
    print(f"guard on / guard off: median {statistics.median(ratios):.3f} over {len(ratios)} pairs "
          f"(range {min(ratios):.3f}-{max(ratios):.3f}); target >= 0.99")
    return 0


if __name__ == "__main__":
    sys.exit(main())
