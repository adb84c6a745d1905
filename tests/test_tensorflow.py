"""TensorFlow: real bursts in children (this process never imports tensorflow), knobs read back
from the pipeline and the compiled model, guard, bad data, and parity with PyTorch."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest

from knobtune.search.errors import UserError
from knobtune.search.launch.runner import run_child
from knobtune.spaces import for_framework
from knobtune.trainers.common.wire import Burst, Request

from conftest import FAST, TINY_BURST, knobtune, study_file

pytestmark = pytest.mark.tensorflow
BURST = Burst(train_samples=640, warmup_samples=64, windows=3)
CTX = {"hardware": {"gpu": False, "bf16": True, "usable_cores": 2}, "workload": {"batch_size": 32}}


def knobs(**overrides: Any) -> dict[str, Any]:
    return {**for_framework("tensorflow").defaults(CTX), **overrides}


def burst(workload: str = "kt_tf_workloads:tiny", timeout: float = 180, options=None, spec=None, **overrides: Any):
    request = Request(workload=workload, workload_options=options or {}, knobs=knobs(**overrides),
                      burst=spec or BURST)
    return run_child("tensorflow", "burst", request, timeout)


def test_baseline_pipeline_is_what_a_newcomer_writes():
    child = burst()
    assert child.outcome == "ok", child.failure
    d = child.result.to_json()
    ops = [e["op"] for e in d["pipeline"]]
    assert ops == ["BatchDataset", "RepeatDataset", "ShuffleDataset", "MapDataset", "MapDataset",
                   "InterleaveDataset", "TensorSliceDataset"]  # sequential, no prefetch, no cache
    assert d["knobs_effective"]["prefetch"] == 0 and d["knobs_effective"]["loop"] == "fit"
    assert d["samples_per_second"] > 0 and 0 <= d["val_accuracy"] <= 1 and len(d["window_rates"]) == 3


def test_pipeline_and_model_knobs_are_really_applied():
    child = burst(cycle_length=4, interleave_parallel_calls=2, map_parallel_calls="autotune", prefetch="autotune",
                  deterministic=False, cache=True, jit_compile=True, mixed_precision="mixed_bfloat16",
                  steps_per_execution=4, accumulation_steps=2, batch_size=16, intra_op_threads=1)
    assert child.outcome == "ok", child.failure
    d = child.result.to_json()
    ops = {e["op"]: e for e in d["pipeline"]}
    assert ops["PrefetchDataset"]["buffer_size"] == -1  # AUTOTUNE, last
    assert d["pipeline"][0]["op"] == "PrefetchDataset"
    assert ops["ParallelInterleaveDataset"] == {"op": "ParallelInterleaveDataset", "num_parallel_calls": 2,
                                                "cycle_length": 4}
    assert ops["ParallelMapDataset"]["num_parallel_calls"] == -1 and ops["ParallelMapDataset"]["deterministic"] == "false"
    assert "CacheDataset" in ops
    eff = d["knobs_effective"]
    assert eff == {**eff, "cycle_length": 4, "interleave_parallel_calls": 2, "map_parallel_calls": "autotune",
                   "prefetch": "autotune", "cache": True, "deterministic": False, "jit_compile": True,
                   "mixed_precision": "mixed_bfloat16", "steps_per_execution": 4, "accumulation_steps": 2,
                   "batch_size": 16, "intra_op_threads": 1}
    assert d["applied"]["policy"] == "mixed_bfloat16" and d["effective_batch_size"] == 32
    # windows end on execution boundaries: every window holds whole executions of 4 steps of 16
    assert all(samples % (4 * 16) == 0 for samples in d["window_samples"])


def test_custom_loop_under_tf_function():
    child = burst(loop="custom", steps_per_execution=2, jit_compile=True, prefetch=2)
    assert child.outcome == "ok", child.failure
    assert child.result.knobs_effective["loop"] == "custom" and child.result.applied["jit_compile"] is True
    assert child.result.amp_skipped_steps == 0


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_nan_is_caught_with_its_step(loop: str):
    child = burst("kt_tf_workloads:diverge", options={"after": 6}, loop=loop)
    assert child.outcome == "nan", child.failure
    assert child.result.nan_step == 6 and "non-finite at step 6" in child.failure


def test_a_combination_tensorflow_rejects_is_invalid_and_says_which():
    child = burst("kt_tf_workloads:no_xla", jit_compile=True)
    assert child.outcome == "invalid", child.failure
    assert "TensorFlow rejected this combination (jit_compile=True" in child.failure


def test_prefetched_batches_piled_up_during_warm_up_are_not_measured():
    # parsing sleeps 2 ms a record on 2 parallel calls (about 1,000 samples/s); prefetch holds 32
    # batches of 16, which fill during a 3 s first step: the settle segment trains through them
    spec = Burst(train_samples=64 + 100 * 16, warmup_samples=64, windows=3)
    rates = {}
    for warmup_cost in (0.0, 3.0):
        child = burst("kt_tf_workloads:slow_input", spec=spec, options={"warmup_cost": warmup_cost}, batch_size=16,
                      map_parallel_calls=2, prefetch=32)
        assert child.outcome == "ok", child.failure
        d = child.result.to_json()
        rates[warmup_cost] = d["samples_per_second"]
        assert d["settle_samples"] >= 32 * 16 and d["trained_samples"] == spec.train_samples
        assert "settle_drained" not in d  # tf.data cannot say how full its buffers are
    assert 0.6 < rates[3.0] / rates[0.0] < 1.6, rates


def test_shuffle_buffer_is_bounded_and_records_come_from_the_request():
    # the probe counted 320 records once for the study; the trial takes that count from its request
    child = run_child("tensorflow", "burst", Request(workload="kt_tf_workloads:bounded_shuffle", knobs=knobs(),
                                                      burst=BURST, train_records=320), 180)
    assert child.outcome == "ok", child.failure
    shuffle = [e for e in child.result.pipeline if e["op"] == "ShuffleDataset"][0]
    assert shuffle["buffer_size"] == 100 == child.result.applied["shuffle_buffer"]
    child = run_child("tensorflow", "burst", Request(workload="kt_tf_workloads:bounded_shuffle", knobs=knobs(),
                                                      burst=BURST, train_records=50,
                                                      workload_options={"shuffle_buffer": 1000}), 180)
    assert child.outcome == "ok", child.failure
    assert child.result.applied["shuffle_buffer"] == 50  # the request's count, not a recount (320)
    assert child.result.applied["eval_batch_size"] == 32 and child.result.applied["tf32"] is False


def test_out_of_memory_in_evaluation_is_oom():
    child = burst("kt_tf_workloads:oom_in_eval")
    assert child.outcome == "oom", (child.outcome, child.failure)
    assert child.failure.startswith("out of memory")


def test_mixed_float16_on_cpu_is_invalid():
    child = burst(mixed_precision="mixed_float16")
    assert child.outcome == "invalid" and "needs a GPU" in child.failure


def test_corrupt_and_missing_tfrecords_are_named(tmp_path: Path):
    for workload, expected in [("kt_tf_workloads:corrupt", "corrupt.tfrecord is corrupt"),
                               ("kt_tf_workloads:missing", "TFRecord file /nonexistent/shard-9.tfrecord does not exist")]:
        path = study_file(tmp_path, f'[study]\nname = "bad"\nframework = "tensorflow"\nworkload = "{workload}"\n')
        proc = knobtune("run", str(path), cwd=tmp_path, check=2)
        assert expected in proc.stderr and "Traceback" not in proc.stderr


def test_tensorflow_missing_is_explained(monkeypatch: pytest.MonkeyPatch):
    from knobtune.search.launch import probe
    from knobtune.trainers.common import names

    monkeypatch.setitem(names.FRAMEWORK_MODULES, "tensorflow", "tensorflow_absent_for_this_test")
    with pytest.raises(UserError, match=r"pip install 'knobtune\[tensorflow\]' \(tensorflow-cpu==2.21.0"):
        probe.require_framework("tensorflow")


STUDY = """
[study]
name = "tiny-tf"
framework = "tensorflow"
workload = "kt_tf_workloads:tiny"
trials = 3
seed = 2
prune_below = 0   # these tests are not about pruning; on a busy machine tiny bursts are pruned at random
{burst}
[space]
batch_size = [16, 32]
accumulation_steps = [1]
jit_compile = [false]
steps_per_execution = [1, 4]
"""


def test_a_tensorflow_study_through_the_cli(tmp_path: Path):
    path = study_file(tmp_path, STUDY.format(burst=TINY_BURST))
    proc = knobtune("run", str(path), *FAST, cwd=tmp_path, check=0)
    assert "baseline" in proc.stdout and "knobtune export tiny-tf" in proc.stdout
    study = optuna.load_study(study_name="tiny-tf", storage=f"sqlite:///{tmp_path / 'knobtune.db'}")
    done = [t for t in study.trials if t.user_attrs.get("outcome")]
    assert len(done) == 3 and all(t.user_attrs["outcome"] == "ok" for t in done), [(t.params, t.user_attrs.get("failure")) for t in done]
    assert done[0].user_attrs["is_baseline"] and done[0].params["prefetch"] == 0
    # the memory headroom guard has both figures on a CPU: the child's peak RSS and what it may use
    assert all(0 < t.user_attrs["memory_fraction"] < 0.9 and t.constraints["memory"] <= 0 for t in done)
    assert done[1].user_attrs["source"] == "advice" and done[1].params["map_parallel_calls"] == "autotune"
    assert study.user_attrs["fingerprint"]["tensorflow"].startswith("2.")
    knobtune("export", "tiny-tf", "-o", "best.json", cwd=tmp_path, check=0)


PARITY_BURST = Burst(train_samples=4000, warmup_samples=400, windows=3)


@pytest.mark.parametrize("workload", ["digits-mlp", "digits-cnn"])
def test_parity_with_pytorch(workload: str):
    """Same workload, baseline knobs: the same parameter count, comparable accuracy."""
    described = {}
    for framework in ("pytorch", "tensorflow"):
        child = run_child(framework, "probe", Request(workload=workload), 300)
        assert child.outcome == "ok", child.failure
        described[framework] = child.result.workload
    assert described["pytorch"]["parameters"] == described["tensorflow"]["parameters"]
    assert described["pytorch"]["train_samples"] == described["tensorflow"]["train_samples"] == 1437
    assert described["pytorch"]["eval_samples"] == described["tensorflow"]["eval_samples"] == 360
    if workload == "digits-cnn":
        return  # the CNN's accuracy parity costs minutes on a 2-core CPU; its shape is checked above
    accuracy = {}
    for framework, ctx in (("pytorch", {"hardware": {"cuda": False, "bf16": True, "usable_cores": 2},
                                        "workload": {"batch_size": 64}}),
                           ("tensorflow", {**CTX, "workload": {"batch_size": 64}})):
        request = Request(workload=workload, knobs=for_framework(framework).defaults(ctx), burst=PARITY_BURST)
        child = run_child(framework, "burst", request, 300)
        assert child.outcome == "ok", child.failure
        accuracy[framework] = child.result.val_accuracy
    assert min(accuracy.values()) > 0.8
    assert abs(accuracy["pytorch"] - accuracy["tensorflow"]) < 0.05, accuracy


def test_tensorflow_diagnose_and_time_to_accuracy(tmp_path: Path):
    text = STUDY.format(burst=TINY_BURST).replace('seed = 2', 'seed = 2\nobjective = "time-to-accuracy"\n'
                                                  'target_accuracy = 0.3\neval_every_samples = 96')
    path = study_file(tmp_path, text.replace("trials = 3", "trials = 2"))
    knobtune("run", str(path), "--no-confirm", cwd=tmp_path, check=0)
    study = optuna.load_study(study_name="tiny-tf", storage=f"sqlite:///{tmp_path / 'knobtune.db'}")
    base = study.trials[0]
    assert base.user_attrs["target_reached"] is True and base.value == base.user_attrs["time_to_accuracy"]
    diagnosis = study.user_attrs["diagnosis"]
    assert diagnosis["baseline"]["bottleneck"] in ("input", "compute")
    assert set(diagnosis["baseline"]["input_variants"]) == {"as configured", "all AUTOTUNE"}
