"""``knobtune export --format snippet``: the winner as code, executed in a real child process."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from knobtune.search.story.snippet import snippet

HARNESS = """
import torch
from torch import nn
from torch.utils.data import TensorDataset
generator = torch.Generator().manual_seed(0)
train_set = TensorDataset(torch.rand(256, 1, 28, 28, generator=generator), torch.randint(0, 10, (256,), generator=generator))
model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 26 * 26, 10))
loss_fn = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
device = torch.device("cpu")
epochs = 1
before = [p.detach().clone() for p in model.parameters()]
exec(open({path!r}).read())
changed = any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
print("trained" if changed else "unchanged", optimizer.param_groups[0]["lr"], torch.get_num_threads())
"""


def doc(framework: str, **knobs) -> dict:
    return {"framework": framework, "study": "s", "trial": 7, "knobs": knobs, "not_applied": {},
            "metrics": {"speedup": 1.3}, "speedup": {"value": 1.4, "figure": "median of 5 paired rounds"},
            "confirmed": {"baseline_won": False}, "lr_scale": 2.0,
            "learning_rate": 0.2, "lr_scaling": "linear"}


def run_snippet(tmp_path: Path, text: str) -> str:
    path = tmp_path / "snippet.py"
    path.write_text(text)
    proc = subprocess.run([sys.executable, "-c", HARNESS.format(path=str(path))], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr + "\n" + text
    return proc.stdout.strip()


def test_pytorch_snippet_runs_and_applies_the_knobs(tmp_path: Path):
    text = snippet(doc("pytorch", batch_size=32, accumulation_steps=2, num_workers=1, prefetch_factor=4,
                       persistent_workers=True, pin_memory=False, intra_op_threads=1, amp="bf16", compile="off",
                       channels_last=True, cudnn_benchmark=False, cudnn_deterministic=False,
                       matmul_precision="highest"))
    assert "1.40x the baseline (median of 5 paired rounds)" in text
    assert "DataLoader(train_set, batch_size=32, shuffle=True, num_workers=1, prefetch_factor=4" in text
    assert "torch.autocast(device_type=device.type, dtype=torch.bfloat16)" in text and "% 2 == 0" in text
    assert run_snippet(tmp_path, text) == "trained 0.2 1"


def test_pytorch_snippet_of_the_defaults_is_a_plain_loop(tmp_path: Path):
    text = snippet(doc("pytorch", batch_size=64, accumulation_steps=1, num_workers=0, amp="off", compile="default",
                       intra_op_threads=0, channels_last=False) | {})
    assert "torch.compile(model)" in text and "autocast" not in text and "num_workers" not in text
    compile(text, "snippet.py", "exec")


def test_tensorflow_snippet_is_valid_python_with_the_knobs():
    text = snippet(doc("tensorflow", batch_size=128, cycle_length=4, interleave_parallel_calls="autotune",
                       map_parallel_calls=2, prefetch="autotune", deterministic=False, cache=True, jit_compile=True,
                       mixed_precision="mixed_bfloat16", steps_per_execution=8, accumulation_steps=2, loop="fit",
                       intra_op_threads=0, tf32=True))
    compile(text, "snippet.py", "exec")
    assert "cycle_length=tf.data.AUTOTUNE" not in text and "cycle_length=4" in text
    assert "ds.map(parse_fn, num_parallel_calls=2, deterministic=False)" in text
    assert text.index("ds.prefetch(tf.data.AUTOTUNE)") > text.index("ds.batch(128")
    assert "set_global_policy('mixed_bfloat16')" in text
    assert "jit_compile=True, steps_per_execution=8" in text and "gradient_accumulation_steps = 2" in text


@pytest.mark.parametrize("executions", [1, 4])
def test_a_tensorflow_step_scripts_snippet_is_the_steps_form(executions):
    knobs = dict(batch_size=64, cycle_length=1, interleave_parallel_calls=0, map_parallel_calls=0, prefetch=0,
                 deterministic=True, cache=False, jit_compile=True, mixed_precision="mixed_float16",
                 steps_per_execution=executions, accumulation_steps=1, loop="fit", intra_op_threads=0, tf32=True)
    text = snippet({**doc("tensorflow", **knobs), "integration": "kt.step"})
    compile(text, "snippet.py", "exec")
    assert "model.fit" not in text and "@tf.function(jit_compile=True)" in text
    assert "LossScaleOptimizer(optimizer)" in text and "set_global_policy('mixed_float16')" in text
    assert ("for _ in tf.range(4):" in text) == (executions == 4)


def test_unknown_framework_is_refused():
    with pytest.raises(ValueError, match="expected 'pytorch' or 'tensorflow'"):
        snippet({"framework": "jax", "knobs": {}})


def test_snippets_carry_the_new_knobs(tmp_path: Path):
    text = snippet(doc("pytorch", batch_size=32, num_workers=1, dataloader_in_order=False, optimizer_impl="fused",
                       expandable_segments=True))
    assert "num_workers=1, in_order=False" in text and "fused=True" in text
    assert text.index("expandable_segments:True") < text.index("import torch")
    assert run_snippet(tmp_path, text).startswith("trained")
    text = snippet(doc("tensorflow", batch_size=64, xla_auto_clustering=True, gpu_thread_mode="gpu_private",
                       map_parallelization=False, private_threadpool_size=2))
    compile(text, "snippet.py", "exec")
    assert text.index("TF_GPU_THREAD_MODE") < text.index("import tensorflow") < text.index("set_jit(True)")
    assert "map_parallelization = False" in text and "private_threadpool_size = 2" in text
    assert text.index("with_options") < text.index("interleave")
    defaults = snippet(doc("tensorflow", batch_size=64, xla_auto_clustering=False, gpu_thread_mode="global",
                           map_parallelization=True, private_threadpool_size=0))
    assert "with_options" not in defaults and "set_jit" not in defaults and "import os" not in defaults
