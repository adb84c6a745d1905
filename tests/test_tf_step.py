"""A hand-written TensorFlow loop (``kt.optimizer``, ``@kt.step``, ``kt.batches``) through the CLI in
real child processes (this process never imports tensorflow): the seed chapter's loop
(studies/own_step_tensorflow.py) tuned, exported and run in production with the export's knobs read
back; a loop that uses its batch itself, for which several steps per call are refused before any
trial, with the reason; a step traced again on every call, an invalid trial that says why."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import FAST, ROOT, TINY_BURST, WORKLOADS, exported_and_run, knobtune, printed_json, stored, study_file

pytestmark = pytest.mark.tensorflow
EXAMPLE = ROOT / "studies" / "own_step_tensorflow.py"
SCRIPT = WORKLOADS / "kt_tf_step_script.py"

STUDY = """
[study]
name = "{name}"
framework = "tensorflow"
script = "{script}"
args = {args}
trials = {trials}
seed = 1
prune_below = 0   # not about pruning; on a busy machine tiny bursts are pruned at random
{burst}
[baseline]
batch_size = 32
steps_per_execution = 2   # several steps per call from the first trial on
[space]
batch_size = [32, 64]
accumulation_steps = [1, 2]
steps_per_execution = {executions}
jit_compile = [false, true]
"""


def step_study(directory: Path, name: str, script: Path, args: list[str], trials: int,
               executions: list[int]) -> Path:
    return study_file(directory, STUDY.format(name=name, script=script, args=json.dumps(args), trials=trials,
                                              executions=executions, burst=TINY_BURST), name=f"{name}.toml")


@pytest.mark.long
def test_own_step_example_tuned_exported_and_run_in_production(tmp_path: Path):
    # (several steps per call in every trial, so in the winner's production run too)
    knobtune("run", str(step_study(tmp_path, "own-step", EXAMPLE, ["--epochs", "2"], 3, [2])), *FAST,
             cwd=tmp_path, check=0)
    trials = stored(tmp_path, "own-step").trials
    assert [t.user_attrs["outcome"] for t in trials] == ["ok"] * 3, [t.user_attrs.get("failure") for t in trials]
    for t in trials:
        a = t.user_attrs
        knobs, applied = a["knobs"], a["applied"]
        assert a["trained_samples"] == 640 and applied["loop"] == "kt.step" and applied["step_graph"] is True
        for name in ("steps_per_execution", "jit_compile", "accumulation_steps", "batch_size"):
            assert knobs[name]["applied"] is True, name
        for name in ("steps_per_execution", "jit_compile", "accumulation_steps"):
            assert applied[name] == knobs[name]["value"], name  # read back from the step and its optimizer
        spe = knobs["steps_per_execution"]["value"]
        assert applied["step_calls"] * spe * knobs["batch_size"]["value"] == 640  # one host call per execution
        assert applied["step_traces"] >= 1 and applied["step_traces_in_windows"] == 0
        assert knobs["loop"]["applied"] is False and "kt.step" in knobs["loop"]["why"]
    assert trials[0].user_attrs["knobs"]["steps_per_execution"]["value"] == 2
    # export, then production with it (several steps per call: the pass ends at the first short execution)
    best, snippet, proc = exported_and_run(tmp_path, "own-step", EXAMPLE, "--epochs", "2")
    assert best["integration"] == "kt.step"
    # the step's form, not model.fit's: the winner's XLA setting and its two steps per call
    assert f"@tf.function(jit_compile={best['knobs']['jit_compile']})" in snippet.stdout
    assert "for _ in tf.range(2):" in snippet.stdout and "model.fit" not in snippet.stdout
    assert proc.returncode == 0, proc.stderr
    assert "loaded " in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout.count("accuracy") == 2  # production runs every epoch
    live = printed_json(proc, "knobtune stats: ")
    for name in ("batch_size", "steps_per_execution", "jit_compile", "accumulation_steps", "mixed_precision",
                 "prefetch", "map_parallel_calls"):
        assert live["knobs"][name] == best["knobs"][name], name
    assert live["samples"] >= 2 * 1437 and live["intervals"] >= 1  # both passes over the digits, watched


def test_a_retracing_step_is_invalid_and_several_steps_refused_for_a_loop_using_its_batch(tmp_path: Path):
    proc = knobtune("run", str(step_study(tmp_path, "bad-loop", SCRIPT, ["--uses-batch", "--retrace"], 1, [1, 2])),
                    *FAST, cwd=tmp_path)
    # the loop casts the batch before the step: the probe's dry run refuses several steps per call
    assert "note: [space] steps_per_execution 2: steps_per_execution > 1 runs several steps per call" in proc.stderr
    assert "uses the batch itself" in proc.stderr and "[baseline] steps_per_execution=2 cannot run here" in proc.stderr
    # the step gets a new Python number every call: traced again on every call, so the baseline is invalid
    assert proc.returncode == 1 and "traced again on every call in the measured windows" in proc.stderr
    base = stored(tmp_path, "bad-loop").trials[0].user_attrs
    assert base["outcome"] == "invalid" and base["knobs"]["steps_per_execution"]["value"] == 1
    assert base["applied"]["step_traces_in_windows"] == base["applied"]["step_calls_in_windows"] > 0
