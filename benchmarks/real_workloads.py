"""The charlm and digits-resnet studies on this machine: the confirmed speedup of each winner.

One run: each of studies/charlm-{pytorch,tensorflow}.toml and studies/digits-resnet-{pytorch,
tensorflow}.toml run as shipped (the trial count from --trials), with knobtune's own interleaved
confirmation of its top candidates against the baseline; prints, per study, the baseline's and the
winner's confirmed median samples/s, the paired speedup and its range over the rounds, both
accuracies and what the winner changed. Not a test: numbers vary with the machine.

    .venv/bin/python benchmarks/real_workloads.py [--trials 10] [--only charlm-pytorch,...]
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from knobtune.search.storage.record import StudyRecord, TrialRecord

from _bench import ROOT, run_study

STUDIES = ("charlm-pytorch", "charlm-tensorflow", "digits-resnet-pytorch", "digits-resnet-tensorflow")


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=10, help="trials per study (default 10)")
    parser.add_argument("--only", default=",".join(STUDIES), help=f"studies to run (default {','.join(STUDIES)})")
    args = parser.parse_args()
    unknown = sorted(set(args.only.split(",")) - set(STUDIES))
    if unknown:
        parser.error(f"--only {args.only!r}: unknown {unknown}; expected names from {', '.join(STUDIES)}")
    return args


def changed(study: Any, number: int) -> dict[str, Any]:
    """The winner's params that differ from the baseline's."""
    base = next(t for t in study.trials if TrialRecord.of(t).is_baseline)
    winner = study.trials[number]
    return {k: v for k, v in winner.params.items() if base.params.get(k) != v}


def summarise(name: str, study: Any, seconds: float) -> str:
    confirmed = StudyRecord.of(study).confirmed or {}
    base, winner = confirmed.get("baseline"), confirmed.get("winner")
    if base is None or winner is None:
        return f"{name}: no confirmed winner ({len(study.trials)} trials, {seconds:.0f} s)"
    medians, accs = confirmed["medians"], confirmed.get("mean_accuracies") or {}
    head = (f"{name}: baseline #{base} {medians[str(base)] or 0:,.0f} samples/s (acc {accs.get(str(base)) or 0:.3f})")
    if winner == base:
        runner = confirmed.get("runner_up") or {}
        return head + (f"; the baseline stays (best candidate #{runner.get('trial')} at {runner.get('speedup') or 0:.2f}x,"
                       f" under min_speedup); {seconds:.0f} s")
    low, high = confirmed.get("speedup_range") or (float("nan"), float("nan"))
    return (head + f"; winner #{winner} {medians[str(winner)] or 0:,.0f} samples/s (acc {accs.get(str(winner)) or 0:.3f}):"
            f" confirmed {confirmed['speedup']:.2f}x (rounds {low:.2f}-{high:.2f}x) with {changed(study, winner)};"
            f" {seconds:.0f} s")


def main() -> int:
    args = arguments()
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only.split(","):
            text = (ROOT / "studies" / f"{name}.toml").read_text()
            text = re.sub(r"(?m)^trials = \d+", f"trials = {args.trials}", text)
            print(f"== {name}: {args.trials} trials, then confirmation", flush=True)
            start = time.monotonic()
            study, _ = run_study(text, f"sqlite:///{Path(tmp) / 'real.db'}", confirm=True)
            lines.append(summarise(name, study, time.monotonic() - start))
            print(lines[-1], flush=True)
    print("\nConfirmed speedups (one run, this machine):")
    for line in lines:
        print(" ", line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
