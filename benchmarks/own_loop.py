"""A user's own training script, tuned and run in production: what does the search buy it, and
does production run at the speed the search confirmed?

1. Runs studies/own-loop-pytorch.toml (studies/own_loop_pytorch.py, six lines changed to use the
   Tuned API) in a scratch folder and prints the confirmed speedup of the winner over the script's
   own settings (paired, interleaved rounds; 1.00x when the baseline was kept).
2. Exports the winner and runs the script in production, alternating with the script without a
   config (its own settings), ``--runs`` times each. Each run's rate is the watchdog's mean
   samples/s after its first interval (time in the script's own evaluation excluded). Prints
   production / confirmed median (fidelity: within the machine's noise) with its spread, and the
   speedup production really got over the untuned script.

    .venv/bin/python benchmarks/own_loop.py [--trials 8] [--runs 3] [--epochs 40]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STUDY = ROOT / "studies" / "own-loop-pytorch.toml"
SCRIPT = ROOT / "studies" / "own_loop_pytorch.py"


def knobtune(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "search.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if proc.returncode != 0:
        sys.exit(f"knobtune {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def production_rate(config: Path | None, epochs: int, interval: float, cwd: Path) -> float:
    env = {k: v for k, v in os.environ.items() if k != "KNOBTUNE_CONFIG"}
    env.update(PYTHONPATH=str(ROOT), KNOBTUNE_WATCHDOG_S=str(interval))
    if config is not None:
        env["KNOBTUNE_CONFIG"] = str(config)
    proc = subprocess.run([sys.executable, str(SCRIPT), "--epochs", str(epochs)], cwd=cwd, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"the script failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("knobtune stats: ")][-1]
    stats = json.loads(line.split(": ", 1)[1])
    if not stats.get("mean_samples_per_second"):
        sys.exit(f"the watchdog closed {stats.get('intervals')} interval(s): run more --epochs")
    return float(stats["mean_samples_per_second"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3, help="production runs of each form (default 3)")
    parser.add_argument("--epochs", type=int, default=40, help="epochs per production run (default 40)")
    parser.add_argument("--interval", type=float, default=1.0, help="watchdog interval in seconds (default 1)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="knobtune-own-loop-") as tmp:
        cwd = Path(tmp)
        print(f"tuning {SCRIPT.name} ({args.trials} trials, then confirmation) ...", flush=True)
        knobtune("run", str(STUDY), "--trials", str(args.trials), "--no-diagnose", cwd=cwd)
        knobtune("export", "own-loop-pytorch", "-o", "best.json", cwd=cwd)
        best = json.loads((cwd / "best.json").read_text())
        confirmed = best.get("confirmed") or {}
        changed = {k: v for k, v in best["knobs"].items() if k not in best.get("not_applied", {})}
        speedup = confirmed.get("speedup") if not confirmed.get("baseline_won") else 1.0
        print(f"winner: trial #{best['trial']} ({'the baseline kept' if confirmed.get('baseline_won') else 'confirmed'})"
              f"; knobs {json.dumps(changed)}")
        print(f"tuned / untuned (search, confirmed paired median): {speedup:.2f}x"
              + (f" (range {confirmed['speedup_range'][0]:.2f}x-{confirmed['speedup_range'][1]:.2f}x)"
                 if confirmed.get("speedup_range") else ""))
        expected = confirmed.get("median") or best["metrics"]["samples_per_second"]
        tuned, untuned = [], []
        for r in range(args.runs):  # alternate, so drift of the machine hits both alike
            pair = [(tuned, cwd / "best.json"), (untuned, None)]
            for rates, config in (pair if r % 2 == 0 else pair[::-1]):
                rates.append(production_rate(config, args.epochs, args.interval, cwd))
            print(f"  run {r + 1}: tuned {tuned[-1]:,.0f} samples/s, untuned {untuned[-1]:,.0f}", flush=True)
        fidelity = [rate / expected for rate in tuned]
        print(f"production / confirmed median ({expected:,.0f} samples/s): median {statistics.median(fidelity):.2f} "
              f"(spread {min(fidelity):.2f}-{max(fidelity):.2f} over {args.runs} runs); target: within the noise")
        realized = [t / u for t, u in zip(tuned, untuned)]
        print(f"tuned / untuned in production: median {statistics.median(realized):.2f}x "
              f"(spread {min(realized):.2f}x-{max(realized):.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
