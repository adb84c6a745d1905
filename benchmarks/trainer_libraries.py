"""The trainers people already use (Hugging Face ``Trainer``, Lightning, a hand-written TensorFlow
step) tuned by knobtune: what knobtune's hooks cost their loop, and what tuning buys over the
script's own settings.

1. **The hooks' cost** (always; measured by _hooks_pytorch.py and _hooks_tensorflow.py, one process
   per library): the example's job (studies/hf_causal_lm.py's two-layer GPT-2,
   studies/lightning_digits.py's MLP, studies/own_step_tensorflow.py's MLP and GradientTape step)
   trained as the user wrote it, and through knobtune's lines without a config
   (``kt.training_arguments`` + ``kt.trainer``; ``kt.lightning_trainer``; ``kt.optimizer`` +
   ``@kt.step`` + ``kt.batches``: the same settings, plus the guard's device op and the watchdog's
   clock read per step), alternating rounds in one process per library (who goes first
   alternates too). A round times the steps after a warm-up; the figure is the median over
   rounds of rate(with knobtune) / rate(without). Target: >= 0.98.
2. **Tuned over the script's own settings** (``--tuned``): ``knobtune run`` on the example's study
   (confirmation on), and the confirmed median of per-round paired ratios of the winner over the
   baseline, as the export states it. Minutes per library.

    .venv/bin/python benchmarks/trainer_libraries.py [--rounds 12] [--steps N] [--tuned]
                                                     [--only hf|lightning|tf-step]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def tuned(study: str, trials: int) -> None:
    """``knobtune run`` on the example's study (confirmation on), and the export's headline."""
    with tempfile.TemporaryDirectory() as work:
        cmd = [sys.executable, "-m", "knobtune", "run", str(ROOT / "studies" / f"{study}.toml"), "--trials",
               str(trials), "--no-diagnose"]
        started = time.perf_counter()
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"{study}: knobtune run failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
            return
        subprocess.run([sys.executable, "-m", "knobtune", "export", study, "-o", "best.json"], cwd=work, check=True,
                       capture_output=True)
        best = json.loads((Path(work) / "best.json").read_text())
        found = best.get("speedup") or {}
        spread = "-".join(f"{r:.2f}x" for r in found.get("range") or [])
        print(f"{study}: {trials} trials in {time.perf_counter() - started:.0f} s; winner trial #{best['trial']}: "
              f"{found.get('value') or 0:.2f}x the script's own settings ({found.get('figure')}, range {spread}); "
              f"knobs {json.dumps(best['knobs'])}", flush=True)


# key -> (name, the file measuring its hooks' cost, the example's study)
LIBRARIES = {"hf": ("Hugging Face Trainer", "_hooks_pytorch.py", "hf-causal-lm"),
             "lightning": ("Lightning", "_hooks_pytorch.py", "lightning-digits"),
             "tf-step": ("TensorFlow @kt.step", "_hooks_tensorflow.py", "own-step-tensorflow")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=12, help="paired rounds for the callback's cost (default 12)")
    parser.add_argument("--steps", type=int, help="optimizer steps per round (default: 60; 600 for the TensorFlow "
                                                   "step, a millisecond each)")
    parser.add_argument("--tuned", action="store_true", help="also tune each example (minutes) and report the "
                                                             "confirmed speedup over the script's own settings")
    parser.add_argument("--trials", type=int, default=12, help="trials per tuned study (default 12)")
    parser.add_argument("--only", choices=tuple(LIBRARIES), help="one library")
    args = parser.parse_args()
    chosen = [key for key in LIBRARIES if args.only in (None, key)]
    for key in chosen:  # each library in a process of its own: torch and TensorFlow never share one
        name, measurer, _ = LIBRARIES[key]
        proc = subprocess.run([sys.executable, str(HERE / measurer), key, "--rounds", str(args.rounds),
                               *(["--steps", str(args.steps)] if args.steps else [])], capture_output=True, text=True)
        figures = [line for line in proc.stdout.splitlines() if "hooks' cost" in line]  # (not the libraries' logs)
        print("\n".join(figures) if proc.returncode == 0 and figures else
              f"{name}: failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}", flush=True)
    if args.tuned:
        for key in chosen:
            tuned(LIBRARIES[key][2], args.trials)
    return 0


if __name__ == "__main__":
    sys.exit(main())
