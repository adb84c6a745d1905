"""TensorFlow data-parallel trials ([study] nproc): each trial one process training MirroredStrategy
replicas over two logical CPU devices, through the CLI and the child; the winner run in production."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from knobtune.search.launch import partition
from knobtune.search.launch.runner import run_child
from knobtune.search.storage.record import TrialRecord
from knobtune.spaces import for_framework
from knobtune.trainers.common.wire import Burst, Request

from conftest import FAST, TINY_BURST, WORKLOADS, knobtune, script_study, stored, study_file

SCRIPT = WORKLOADS / "kt_tf_script.py"
STEP_SCRIPT = WORKLOADS / "kt_tf_step_script.py"
PHYSICAL = len(partition.physical_groups(partition.machine_cores()))
# (nproc is bounded by the physical cores, as for PyTorch's ranks, though the replicas share one process)
pytestmark = [pytest.mark.tensorflow, pytest.mark.skipif(PHYSICAL < 2, reason="two replicas need two physical cores")]

BUILTIN = """
[study]
name = "mirrored"
framework = "tensorflow"
workload = "kt_tf_workloads:tiny"
trials = 3
seed = 1
prune_below = 0
nproc = 2
{burst}
[baseline]
batch_size = 16
cross_device_ops = "reduction_to_one_device"
[space]
batch_size = [16]
loop = ["fit", "custom"]
jit_compile = [false, true]
accumulation_steps = [1, 2]
steps_per_execution = [1, 2]
cross_device_ops = ["reduction_to_one_device", "collective"]
"""

SCRIPTED = """
[study]
name = "mirrored-script"
framework = "tensorflow"
script = "{script}"
args = {args}
trials = {trials}
seed = 1
prune_below = 0
nproc = 2
{burst}
[baseline]
batch_size = 16
cross_device_ops = "hierarchical_copy"
[space]
batch_size = [16]
cross_device_ops = ["hierarchical_copy"]
steps_per_execution = [1]
"""


@pytest.mark.long
def test_a_builtin_study_trains_each_trial_as_mirrored_replicas(tmp_path: Path):
    proc = knobtune("run", str(study_file(tmp_path, BUILTIN.format(burst=TINY_BURST))), *FAST, cwd=tmp_path, check=0)
    assert "2 replicas per trial (MirroredStrategy in one process" in proc.stderr
    assert "on a trial's share (2 replicas)" in proc.stderr  # the probe ran where a trial runs
    # what the probe found MirroredStrategy cannot do on logical CPU devices is not searched, with the reason
    assert "loop 'custom': knobtune's own @tf.function loop trains one replica" in proc.stderr
    assert "jit_compile True: XLA (jit_compile=True) under MirroredStrategy fails here" in proc.stderr
    assert "accumulation_steps 2: Keras' gradient accumulation under MirroredStrategy fails here" in proc.stderr
    study = stored(tmp_path, "mirrored")
    trials = [TrialRecord.of(t) for t in study.trials]
    base = trials[0]  # the baseline
    assert base.outcome == "ok", [t.failure for t in trials]
    group = base.group
    assert group["strategy"] == "MirroredStrategy" and group["replicas"] == 2 and group["nproc"] == 2
    assert [d.rsplit("/", 1)[-1] for d in group["devices"]] == ["device:CPU:0", "device:CPU:1"]
    # the knob as the strategy reports it, and 16 samples per replica: 32 per step
    assert base.knobs["cross_device_ops"].value == "reduction_to_one_device" and base.knobs["cross_device_ops"].applied
    assert base.knobs["batch_size"].value == 16 and base.effective_batch_size == 32
    assert 640 - 32 < base.trained_samples <= 640 + 32
    # several steps per call with the collective all-reduce fails on logical CPUs (the probe tried it): such a
    # trial is invalid without a child, and says why
    for frozen, t in zip(study.trials, trials):
        if frozen.params.get("steps_per_execution") == 2 and frozen.params.get("cross_device_ops") == "collective":
            assert t.outcome == "invalid" and "MirroredStrategy fails here" in t.failure
        else:
            assert t.outcome == "ok", t.failure
    scaling = study.user_attrs["scaling"]  # the group and one replica alone, back to back
    assert scaling["nproc"] == 2 and scaling["members"] == "replicas"
    assert scaling["baseline"]["efficiency"] == pytest.approx(
        scaling["baseline"]["group"] / (2 * scaling["baseline"]["one_rank"]))
    assert "scaling baseline: 2 replicas run" in proc.stdout and "one replica alone, back to back" in proc.stdout
    assert study.user_attrs["partition"]["nproc"] == 2


@pytest.mark.long
def test_a_script_study_of_two_replicas_and_its_winner_in_production(tmp_path: Path):
    path = script_study(tmp_path, SCRIPTED, SCRIPT, ["--epochs", "50"], trials=1)
    knobtune("run", str(path), *FAST, cwd=tmp_path, check=0)
    trials = [TrialRecord.of(t) for t in stored(tmp_path, "mirrored-script").trials if t.state.is_finished()]
    assert trials and all(t.outcome == "ok" and t.group["replicas"] == 2 for t in trials), [t.failure for t in trials]
    assert trials[0].knobs["cross_device_ops"].value == "hierarchical_copy"
    knobtune("export", "mirrored-script", "-o", "best.json", cwd=tmp_path, check=0)
    best = json.loads((tmp_path / "best.json").read_text())
    assert best["group"]["nproc"] == 2 and best["group"]["strategy"] == "MirroredStrategy"
    assert best["group"]["launch"] == "KNOBTUNE_CONFIG=best.json python train.py"  # one process
    snippet = knobtune("export", "mirrored-script", "--format", "snippet", cwd=tmp_path, check=0).stdout
    assert "strategy = tf.distribute.MirroredStrategy(cross_device_ops=tf.distribute.HierarchicalCopyAllReduce())" \
        in snippet and "ds = ds.batch(global_batch, drop_remainder=True)" in snippet
    assert "with strategy.scope():" in snippet
    compile(snippet, "snippet.py", "exec")
    env = {**os.environ, "KNOBTUNE_CONFIG": str(tmp_path / "best.json")}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--epochs", "1"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = next(json.loads(ln[len("stats "):]) for ln in proc.stdout.splitlines() if ln.startswith("stats "))
    # the script's model trained under the winner's strategy: its all-reduce and batch read back
    assert stats["knobs"]["cross_device_ops"] == "hierarchical_copy" and stats["knobs"]["batch_size"] == 16
    assert "was measured" not in proc.stderr  # as many replicas as measured: no warning
    # a model built before Tuned.load(): on this CPU that started TensorFlow's runtime before the CPU could be
    # divided into the replicas' devices (on GPUs: its variables are not mirrored, kt.compile says so)
    early = subprocess.run([sys.executable, str(SCRIPT), "--epochs", "1", "--model-first"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
    assert early.returncode != 0
    assert "2 replicas on this CPU need 2 logical CPU devices, made before TensorFlow's runtime starts: call " \
           "Tuned.load() before any TensorFlow operation" in early.stderr


def test_one_replicas_nan_is_the_groups():
    # only the second replica's outputs turn non-finite at step 6: the guard sums the replicas' flags
    request = Request(workload="kt_tf_workloads:diverge_on_one_replica", workload_options={"after": 6},
                      knobs={**for_framework("tensorflow").defaults({"hardware": {"gpu": False}, "workload": {}}),
                             "batch_size": 16, "cross_device_ops": "reduction_to_one_device"}, nproc=2,
                      burst=Burst(train_samples=640, warmup_samples=64, windows=3), workdir=str(WORKLOADS))
    child = run_child("tensorflow", "burst", request, 180)
    assert child.outcome == "nan", child.failure
    assert child.result.nan_step == 6 and "non-finite at step 6" in child.failure


def test_what_cannot_run_on_replicas_is_refused_before_any_trial(tmp_path: Path):
    # a script with its own @tf.function step (kt.step) trains one replica
    path = script_study(tmp_path, SCRIPTED.replace('cross_device_ops = "hierarchical_copy"\n', ""), STEP_SCRIPT,
                        trials=1)
    proc = knobtune("run", str(path), *FAST, cwd=tmp_path, check=2)
    assert "kt.step: a data-parallel run (2 MirroredStrategy replicas) trains through kt.fit" in proc.stderr
    assert "trial #" not in proc.stderr
