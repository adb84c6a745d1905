"""The trainers people already use (Hugging Face ``Trainer``, Lightning, a hand-written TensorFlow
step) tuned by knobtune: what knobtune's hooks cost their loop, and what tuning buys over the
script's own settings.

1. **The hooks' cost** (always): the example's job (studies/hf_causal_lm.py's two-layer GPT-2,
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
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "studies"))

WARMUP_STEPS = 10


class Clock:
    """Step-end times; the rate over the steps after the warm-up."""

    def __init__(self, batch: int) -> None:
        self.batch, self.times = batch, []

    def tick(self) -> None:
        self.times.append(time.perf_counter())

    def rate(self) -> float:
        timed = self.times[WARMUP_STEPS:]
        return (len(timed) - 1) * self.batch / (timed[-1] - timed[0])


def hf_round(steps: int) -> tuple[Callable[[], float], Callable[[], float]]:
    """(without knobtune, with it): each trains ``steps`` optimizer steps and returns its rate."""
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    import hf_causal_lm as job
    from knobtune.pytorch import Tuned
    from knobtune.trainers.common import text

    corpus = text.prepare(context=job.CONTEXT, train_chars=400_000, eval_windows=128)
    train = job.Lines(corpus.train)
    kt = Tuned.load()
    batch = 16

    class Timing(TrainerCallback):
        def __init__(self, clock: Clock) -> None:
            self.clock = clock

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.clock.tick()

    def arguments() -> TrainingArguments:
        return TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=steps, per_device_train_batch_size=batch,
                                 learning_rate=1e-3, save_strategy="no", report_to="none", disable_tqdm=True,
                                 logging_strategy="no", seed=0, dataloader_drop_last=True)

    def run(wrapped: bool) -> float:
        torch.manual_seed(0)
        clock = Clock(batch)
        args = kt.training_arguments(arguments()) if wrapped else arguments()
        trainer = Trainer(model=job.build_model(), args=args, train_dataset=train, data_collator=job.pad,
                          callbacks=[Timing(clock)])
        if wrapped:
            trainer = kt.trainer(trainer)
        trainer.train()
        return clock.rate()

    return (lambda: run(False)), (lambda: run(True))


def lightning_round(steps: int) -> tuple[Callable[[], float], Callable[[], float]]:
    import lightning.pytorch as L
    import torch

    import lightning_digits as job
    from knobtune.pytorch import Tuned

    kt = Tuned.load()
    batch = 64
    data = job.Digits(kt, batch)
    data.setup("fit")
    plain_loader = torch.utils.data.DataLoader(data.train_set, batch_size=batch, shuffle=True, drop_last=True)
    kt_loader = kt.dataloader(data.train_set, batch_size=batch, shuffle=True, drop_last=True)

    class Timing(L.Callback):
        def __init__(self, clock: Clock) -> None:
            self.clock = clock

        def on_train_batch_end(self, *args: Any) -> None:
            self.clock.tick()

    options = dict(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False)

    def run(wrapped: bool) -> float:
        torch.manual_seed(0)
        clock = Clock(batch)
        if wrapped:
            trainer = kt.lightning_trainer(**options, callbacks=[Timing(clock)])
            model = kt.prepare(job.Classifier())
            trainer.fit(model, train_dataloaders=kt_loader)
        else:
            trainer = L.Trainer(**options, callbacks=[Timing(clock)])
            trainer.fit(job.Classifier(), train_dataloaders=plain_loader)
        return clock.rate()

    return (lambda: run(False)), (lambda: run(True))


def tf_step_round(steps: int) -> tuple[Callable[[], float], Callable[[], float]]:
    import keras
    import numpy as np
    import tensorflow as tf

    import own_step_tensorflow as job
    from knobtune.tensorflow import Tuned

    batch = 64
    rng = np.random.default_rng(0)
    images = rng.random((batch * (WARMUP_STEPS + steps), 28, 28, 1), dtype=np.float32)
    labels = rng.integers(0, 10, len(images))
    data = tf.data.Dataset.from_tensor_slices((images, labels)).batch(batch, drop_remainder=True).cache()
    for _ in data:  # the cache filled before any round
        pass
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def run(wrapped: bool) -> float:
        keras.utils.set_random_seed(0)
        model = job.build_model()
        kt = Tuned.load() if wrapped else None
        optimizer = keras.optimizers.Adam(1e-3)
        if kt is not None:
            optimizer = kt.optimizer(model, optimizer)
        else:
            optimizer.build(model.trainable_variables)

        def train_step(inputs: tf.Tensor, targets: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                loss = loss_fn(targets, model(inputs, training=True))
                scaled = optimizer.scale_loss(loss)
            gradients = tape.gradient(scaled, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            return loss

        step = kt.step(train_step) if kt is not None else tf.function(train_step)
        clock = Clock(batch)
        for inputs, targets in (kt.batches(data) if kt is not None else data):
            loss = step(inputs, targets)
            float(loss)  # (the same sync in both: a step's end)
            clock.tick()
        return clock.rate()

    return (lambda: run(False)), (lambda: run(True))


def cost(name: str, make: Callable[[int], tuple[Callable[[], float], Callable[[], float]]], rounds: int,
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
        changed = {k: v for k, v in best["knobs"].items()}
        spread = "-".join(f"{r:.2f}x" for r in found.get("range") or [])
        print(f"{study}: {trials} trials in {time.perf_counter() - started:.0f} s; winner trial #{best['trial']}: "
              f"{found.get('value') or 0:.2f}x the script's own settings ({found.get('figure')}, range {spread}); "
              f"knobs {json.dumps(changed)}", flush=True)


LIBRARIES = {"hf": ("Hugging Face Trainer", hf_round, "hf-causal-lm", 60),
             "lightning": ("Lightning", lightning_round, "lightning-digits", 60),
             # (a step of about a millisecond: 60 of them time less than the machine's jitter)
             "tf-step": ("TensorFlow @kt.step", tf_step_round, "own-step-tensorflow", 600)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=12, help="paired rounds for the callback's cost (default 12)")
    parser.add_argument("--steps", type=int, help="optimizer steps per round (default: 60; 600 for the TensorFlow "
                                                   "step, a millisecond each)")
    parser.add_argument("--tuned", action="store_true", help="also tune each example (minutes) and report the "
                                                             "confirmed speedup over the script's own settings")
    parser.add_argument("--trials", type=int, default=12, help="trials per tuned study (default 12)")
    parser.add_argument("--only", choices=tuple(LIBRARIES), help="one library")
    parser.add_argument("--cost-only", action="store_true", help=argparse.SUPPRESS)  # (one library's process)
    args = parser.parse_args()
    os.environ.pop("KNOBTUNE_CONFIG", None)
    os.environ.setdefault("KNOBTUNE_WATCHDOG_S", "30")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    for quiet in ("lightning.pytorch", "lightning.fabric", "transformers", "knobtune", "tensorflow"):
        logging.getLogger(quiet).setLevel(logging.ERROR)
    chosen = [key for key in LIBRARIES if args.only in (None, key)]
    if args.cost_only:
        name, make, _, steps = LIBRARIES[args.only]
        cost(name, make, args.rounds, args.steps or steps)
        return 0
    for key in chosen:  # each library in a process of its own: torch and TensorFlow never share one
        proc = subprocess.run([sys.executable, __file__, "--only", key, "--cost-only", "--rounds", str(args.rounds),
                               *(["--steps", str(args.steps)] if args.steps else [])], capture_output=True, text=True)
        figures = [line for line in proc.stdout.splitlines() if "hooks' cost" in line]  # (not the libraries' logs)
        print("\n".join(figures) if proc.returncode == 0 and figures else
              f"{LIBRARIES[key][0]}: failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}", flush=True)
    if args.tuned:
        for key in chosen:
            tuned(LIBRARIES[key][2], args.trials)
    return 0


if __name__ == "__main__":
    sys.exit(main())
