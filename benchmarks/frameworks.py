"""PyTorch vs TensorFlow on digits-mlp, and knobtune's tf.data tuning vs tf.data's own AUTOTUNE.

One run on this machine:
  1. a knobtune study per framework (default 16 trials each) on digits-mlp, same data, model,
     augmentation, held-out split and burst;
  2. re-measured side by side, interleaved, 3 times each: each framework's baseline and winner,
     and the TensorFlow winner with its pipeline knobs replaced by tf.data.AUTOTUNE everywhere
     (cycle_length, interleave and map parallelism, prefetch: the framework's own autotuner), and
     the baseline with the same all-AUTOTUNE pipeline.
Prints the ratios. Not a test: numbers vary with the machine.

    .venv/bin/python benchmarks/frameworks.py [--trials 16] [--repeats 3]
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from _bench import arguments, interleaved, median, plan_for, run_study, study_text

SPACE = """
batch_size = [32, 64, 128, 256]
accumulation_steps = [1, 2]
"""
PIPELINE = ("cycle_length", "interleave_parallel_calls", "map_parallel_calls", "prefetch")


def main() -> int:
    args = arguments(__doc__, trials=16)

    from knobtune.search.story import results

    texts = {fw: study_text(f"bench-{fw}", fw, args.trials, args.seed, SPACE) for fw in ("pytorch", "tensorflow")}
    best, base = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for framework, text in texts.items():
            print(f"1. knobtune study: {framework}, {args.trials} trials", flush=True)
            study, _ = run_study(text, f"sqlite:///{Path(tmp) / 'frameworks.db'}")
            best[framework], base[framework] = dict(results.best(study).params), dict(results.baseline(study).params)

    plans = {fw: plan_for(text) for fw, text in texts.items()}
    autotune = {k: "autotune" for k in PIPELINE}
    configs = {
        "pt-baseline": ("pytorch", base["pytorch"]), "pt-best": ("pytorch", best["pytorch"]),
        "tf-baseline": ("tensorflow", base["tensorflow"]), "tf-best": ("tensorflow", best["tensorflow"]),
        "tf-best+AUTOTUNE": ("tensorflow", {**best["tensorflow"], **autotune}),
        "tf-baseline+AUTOTUNE": ("tensorflow", {**base["tensorflow"], **autotune}),
    }
    print(f"\n2. side by side, interleaved, {args.repeats} repeats", flush=True)
    rates = interleaved({name: (plans[fw], params) for name, (fw, params) in configs.items()}, args.repeats)
    m = {name: median(v) for name, v in rates.items()}

    print("\n=== digits-mlp: PyTorch vs TensorFlow, this machine (median samples/s of the side-by-side runs) ===")
    for name, value in m.items():
        print(f"  {name:<22} {value:>9,.0f}   {configs[name][1]}")
    pt_b, pt_t = m["pt-baseline"], m["pt-best"]
    tf_b, tf_t = m["tf-baseline"], m["tf-best"]
    print(f"pytorch    best/baseline            = {pt_t / pt_b:.2f}x")
    print(f"tensorflow best/baseline            = {tf_t / tf_b:.2f}x")
    print(f"tensorflow/pytorch, baselines       = {tf_b / pt_b:.2f}x")
    print(f"tensorflow/pytorch, tuned           = {tf_t / pt_t:.2f}x")
    print(f"tuned pipeline / all-AUTOTUNE       = {tf_t / m['tf-best+AUTOTUNE']:.2f}x  "
          f"(same model settings; pipeline knobs tuned vs tf.data.AUTOTUNE everywhere)")
    print(f"baseline+AUTOTUNE / baseline        = {m['tf-baseline+AUTOTUNE'] / tf_b:.2f}x  "
          f"(what AUTOTUNE alone does to the newcomer's pipeline)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
