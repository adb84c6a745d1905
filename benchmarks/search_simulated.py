"""Search strategies on two simulated full spaces: many seeds in seconds, to choose a sampler's
rule for spaces too large to measure as a grid (the demo studies'), never to replace the demos.

The spaces are tests/test_effects.py's: ``LARGE`` (15 knobs shaped like TensorFlow's on a CPU:
several slow untried values, a few fast ones) and ``BUNDLED`` (12 knobs shaped like PyTorch's: the
advice bundles a fast value with two slow ones). Each study: the baseline, the advice, then the
sampler's trials; scored by the true rate of the better of its top two measured (as confirmation
would pick) over the space's best. Prints the median, the worst and the seeds reaching 0.9.

    .venv/bin/python benchmarks/search_simulated.py [--seeds 48] [--noise 0.1] [--trials 12]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_effects import BUNDLED, BUNDLED_ADVICE, LARGE, LARGE_ADVICE, found_in_a_large_space  # noqa: E402

from knobtune.search.study.effects import EffectsSampler  # noqa: E402

SAMPLERS = {
    "effects (knobtune's)": lambda seed: EffectsSampler(seed=seed),
    "random": lambda seed: optuna.samplers.RandomSampler(seed=seed),
    "tpe (knobtune's)": lambda seed: optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True,
                                                                n_startup_trials=4),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=48)
    parser.add_argument("--noise", type=float, default=0.1, help="each measurement off by up to +- this (0.1)")
    parser.add_argument("--trials", type=int, default=12, help="per study, the baseline and the advice included")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    for shape, space, advice in (("TensorFlow-like", LARGE, LARGE_ADVICE), ("PyTorch-like", BUNDLED, BUNDLED_ADVICE)):
        for name, make in SAMPLERS.items():
            found = [found_in_a_large_space(space, advice, seed, make(seed), args.noise, args.trials)
                     for seed in range(args.seeds)]
            print(f"{shape:16s} {name:21s} found / best: median {statistics.median(found):.2f}, "
                  f"worst {min(found):.2f}, seeds >= 0.9: {sum(f >= 0.9 for f in found)}/{len(found)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
