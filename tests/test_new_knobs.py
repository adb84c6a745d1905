"""The knobs practitioners tune on GPUs (issue 12, part 3), on this machine: applied in a real
child and read back from the framework's own objects (the optimizer's param groups, the
DataLoader, TensorFlow's jit setting, the pipeline's options); their defaults are today's
behaviour, so a study that names none of them keeps its measurement key and baseline.
The CUDA-only ones (expandable_segments, gpu_thread_mode) are tested in tests/test_cuda.py and
tests/test_gating.py (gated off here, with the reason)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from knobtune.search.launch.runner import run_child
from knobtune.search.study.definition import from_dict
from knobtune.spaces import for_framework
from knobtune.trainers.common.wire import Burst, Request

from recorded import DATA

BURST = Burst(train_samples=640, warmup_samples=64, windows=3)
NEW = {"pytorch": ("optimizer_impl", "dataloader_in_order", "expandable_segments"),
       "tensorflow": ("xla_auto_clustering", "gpu_thread_mode", "map_parallelization", "private_threadpool_size")}
# what this machine's probe reports beside the recorded studies' hardware (their fingerprints predate it)
NOW = {"pytorch": ({"loader_in_order": True},
                   {"optimizer": "Adam", "optimizer_impls": ["default", "foreach", "fused"]}),
       "tensorflow": ({}, {})}


def burst(framework: str, workload: str, keep: Path | None = None, **overrides: Any):
    ctx = {"hardware": {"bf16": True, "usable_cores": 2}, "workload": {"batch_size": 32}}
    knobs = {**for_framework(framework).defaults(ctx), **overrides}
    if keep is not None:
        keep.mkdir()
    child = run_child(framework, "burst", Request(workload=workload, knobs=knobs, burst=BURST), 180, keep=keep)
    assert child.outcome == "ok", child.failure
    return child.result.to_json()


@pytest.mark.parametrize("name", ["mlp-pytorch", "demo-pytorch", "mlp-tensorflow"])
def test_a_study_naming_no_new_knob_keeps_its_measurement_key_and_baseline(name: str):
    doc = json.loads((DATA / f"{name}.json").read_text())
    attrs = doc["user_attrs"]
    definition = from_dict(attrs["definition"])
    assert definition.measurement_key() == attrs["measurement"]
    framework = definition.study.framework
    space = for_framework(framework)
    hardware, workload = NOW[framework]
    ctx = {"hardware": {**attrs["fingerprint"]["hardware"], **hardware},
           "workload": {"batch_size": 64, "conv": False, **workload}}
    offer = space.offer(ctx, definition.space, definition.baseline)
    params = space.baseline_params(offer, ctx, definition.baseline)
    recorded = next(t["params"] for t in doc["trials"] if t["user_attrs"].get("is_baseline"))
    assert {k: v for k, v in params.items() if k not in NEW[framework]} == recorded
    resolved = space.resolve(params, offer, ctx, definition.baseline)
    assert {k: resolved[k].value for k in NEW[framework]} == {k: space.knob(k).default for k in NEW[framework]}


def test_pytorch_optimizer_impl_and_in_order_are_read_back_from_the_objects_built():
    default = burst("pytorch", "kt_test_workloads:tiny", num_workers=1)
    foreach = burst("pytorch", "kt_test_workloads:tiny", num_workers=1, optimizer_impl="foreach",
                    dataloader_in_order=False)
    fused = burst("pytorch", "kt_test_workloads:tiny", optimizer_impl="fused")
    # the defaults are what torch does unasked: Adam as the workload built it, batches in order
    assert default["knobs_effective"]["optimizer_impl"] == "default"
    assert default["knobs_effective"]["dataloader_in_order"] is True
    assert default["knobs_effective"]["expandable_segments"] is False  # no CUDA allocator here
    assert foreach["knobs_effective"]["optimizer_impl"] == "foreach"
    assert foreach["knobs_effective"]["dataloader_in_order"] is False
    assert fused["knobs_effective"]["optimizer_impl"] == "fused"  # torch's fused CPU Adam
    assert {d["applied"]["optimizer"] for d in (default, foreach, fused)} == {"Adam"}
    assert default["loader"] == foreach["loader"]  # the loader's other settings are untouched


def test_pytorch_optimizer_impl_the_optimizer_lacks_is_invalid_and_names_it():
    ctx = {"hardware": {"bf16": True, "usable_cores": 2}, "workload": {"batch_size": 32}}
    knobs = {**for_framework("pytorch").defaults(ctx), "optimizer_impl": "fused"}
    child = run_child("pytorch", "burst", Request(workload="kt_test_workloads:rmsprop", knobs=knobs,
                                                  burst=BURST), 120)
    assert child.outcome == "invalid" and "RMSprop has no fused implementation" in child.failure


@pytest.mark.tensorflow
def test_tensorflow_auto_clustering_and_data_options_are_read_back(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")  # XLA says in the child's log when it compiled a cluster
    default = burst("tensorflow", "kt_tf_workloads:tiny", keep=tmp_path / "default")
    tuned = burst("tensorflow", "kt_tf_workloads:tiny", keep=tmp_path / "tuned", xla_auto_clustering=True,
                  map_parallelization=False, private_threadpool_size=2)
    # auto-clustering reached XLA on this CPU (the jit setting and --tf_xla_cpu_global_jit), and only when asked
    compiled = "Compiled cluster using XLA"
    assert compiled in (tmp_path / "tuned" / "output.log").read_text()
    assert compiled not in (tmp_path / "default" / "output.log").read_text()
    assert {k: default["knobs_effective"][k] for k in NEW["tensorflow"]} == {
        "xla_auto_clustering": False, "gpu_thread_mode": "global", "map_parallelization": True,
        "private_threadpool_size": 0}
    assert {k: tuned["knobs_effective"][k] for k in NEW["tensorflow"]} == {
        "xla_auto_clustering": True, "gpu_thread_mode": "global", "map_parallelization": False,
        "private_threadpool_size": 2}
    # the options hold for the whole pipeline: set at its source, prefetch and batch stay where they were
    assert [e["op"] for e in tuned["pipeline"]][-2:] == ["OptionsDataset", "TensorSliceDataset"]
    assert [e["op"] for e in default["pipeline"]] == [e["op"] for e in tuned["pipeline"] if e["op"] != "OptionsDataset"]
