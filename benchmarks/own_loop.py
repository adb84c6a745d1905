"""A user's own training script, tuned and run in production: what does the search buy it, and
does production run at the speed the search confirmed?

1. Runs studies/own-loop-pytorch.toml (studies/own_loop_pytorch.py, six lines changed to use the
   Tuned API) in a scratch folder and prints the confirmed speedup of the winner over the script's
   own settings (paired, interleaved rounds; 1.00x when the baseline was kept).
2. Exports the winner and runs the script in production with it and without a config (its own
   settings), and the winner's burst as its trials measured it, in rotated rounds (``--runs``).
   A production run's rate is the watchdog's mean samples/s over its judged intervals: after
   the first, without the ones in which torch.compile recompiled (the epoch's shorter last
   batch), and without the script's own evaluation. Prints production / confirmed samples/s
   (the machine may have changed since the search) and production / the burst of the same
   round (fidelity, paired), against the machine's noise: how far the winner's own
   confirmation rounds strayed from their median (at least 5 %); and the speedup production
   really got over the untuned script.

    .venv/bin/python benchmarks/own_loop.py [--trials 8] [--runs 4] [--epochs 80] [--workdir DIR]
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
sys.path.insert(0, str(ROOT))
STUDY = ROOT / "studies" / "own-loop-pytorch.toml"
SCRIPT = ROOT / "studies" / "own_loop_pytorch.py"


def knobtune(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "knobtune", *args], cwd=cwd, capture_output=True, text=True,
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


def burst_rate(best: dict, cwd: Path) -> float:
    """The winner measured again as its trials were: one burst of the script in a child process."""
    from knobtune.search.launch.runner import run_child
    from knobtune.trainers.common.wire import Burst, Request

    burst = Burst.from_json({k: v for k, v in best["burst"].items() if k != "timeout_s"})  # (the study file's)
    request = Request(script=str(SCRIPT), args=tuple(best.get("args") or ()), knobs=best["knobs"], burst=burst,
                      workdir=str(cwd), lr_scale=best.get("lr_scale") or 1.0)
    child = run_child("pytorch", "burst", request, float(best["burst"].get("timeout_s") or 300))
    if child.outcome != "ok":
        sys.exit(f"the winner's burst ended {child.outcome}: {child.failure}")
    return float(child.result.samples_per_second)  # type: ignore[arg-type]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--runs", type=int, default=4, help="production runs of each form (default 4)")
    parser.add_argument("--epochs", type=int, default=80, help="epochs per production run (default 80)")
    parser.add_argument("--interval", type=float, default=1.0, help="watchdog interval in seconds (default 1)")
    parser.add_argument("--workdir", type=Path, help="keep the study, export and logs here (default: a temporary "
                                                     "folder, removed)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="knobtune-own-loop-") as tmp:
        cwd = args.workdir or Path(tmp)
        cwd.mkdir(parents=True, exist_ok=True)
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
        expected = confirmed.get("samples_per_second") or best["metrics"]["samples_per_second"]
        low, high = confirmed.get("samples_per_second_range") or (expected, expected)
        tuned, untuned, burst = [], [], []
        forms = [(tuned, lambda: production_rate(cwd / "best.json", args.epochs, args.interval, cwd)),
                 (untuned, lambda: production_rate(None, args.epochs, args.interval, cwd)),
                 (burst, lambda: burst_rate(best, cwd))]
        for r in range(args.runs):  # rotate, so drift of the machine hits every form alike
            for rates, measure in forms[r % 3:] + forms[:r % 3]:
                rates.append(measure())
            print(f"  round {r + 1}: production tuned {tuned[-1]:,.0f} samples/s, untuned {untuned[-1]:,.0f}; "
                  f"the winner's burst now {burst[-1]:,.0f}", flush=True)
        # the machine's noise: how far the winner's own confirmation rounds strayed from their median
        noise = max(1 - low / expected, high / expected - 1, 0.05)
        fidelity = [rate / expected for rate in tuned]
        print(f"production / confirmed samples/s ({expected:,.0f}, rounds {low:,.0f}-{high:,.0f}): median "
              f"{statistics.median(fidelity):.2f} (spread {min(fidelity):.2f}-{max(fidelity):.2f} over {args.runs} "
              f"runs; the machine may have changed since the search)")
        paired = [t / b for t, b in zip(tuned, burst)]
        middle = statistics.median(paired)
        print(f"production / the winner's burst in the same round: median {middle:.2f} (spread "
              f"{min(paired):.2f}-{max(paired):.2f}); target: within the noise (+-{noise:.0%}): "
              f"{'met' if abs(middle - 1) <= noise else 'NOT met'}")
        realized = [t / u for t, u in zip(tuned, untuned)]
        print(f"tuned / untuned in production: median {statistics.median(realized):.2f}x "
              f"(spread {min(realized):.2f}x-{max(realized):.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
