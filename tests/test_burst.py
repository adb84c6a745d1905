"""Real PyTorch bursts in child processes: knobs really applied and read back, outcomes classified."""
from __future__ import annotations

from typing import Any

import pytest

from knobtune.search.launch.runner import group_members, run_child
from knobtune.spaces import for_framework
from knobtune.trainers.common.wire import Burst, Request

BURST = Burst(train_samples=640, warmup_samples=64, windows=3)
CPU_CTX = {"hardware": {"cuda": False, "bf16": True, "usable_cores": 2}, "workload": {"batch_size": 32}}


def knobs(**overrides: Any) -> dict[str, Any]:
    """Every PyTorch knob at its default, then ``overrides`` (what the engine sends a child)."""
    return {**for_framework("pytorch").defaults(CPU_CTX), **overrides}


def burst(workload: str = "kt_test_workloads:tiny", timeout: float = 120, options=None, **overrides: Any):
    request = Request(workload=workload, workload_options=options or {}, knobs=knobs(**overrides), burst=BURST)
    return run_child("pytorch", "burst", request, timeout)


def test_baseline_burst_measures_and_evaluates():
    child = burst()
    assert child.outcome == "ok", child.failure
    d = child.result.to_json()
    assert d["samples_per_second"] > 0 and len(d["window_rates"]) == 3
    assert 0 <= d["samples_per_second_cv"] < 5
    assert d["trained_samples"] == 640 and d["warmup_seconds"] > 0
    assert 0.0 <= d["val_accuracy"] <= 1.0 and d["final_loss"] > 0
    assert d["peak_memory_mb"] > 50  # the child's max RSS: torch alone is more than this
    assert d["loader"]["num_workers"] == 0 and d["loader"]["prefetch_factor"] is None


def test_knobs_are_really_applied():
    child = burst(batch_size=16, accumulation_steps=2, num_workers=1, prefetch_factor=4,
                  persistent_workers=True, amp="bf16", intra_op_threads=1)
    assert child.outcome == "ok", child.failure
    d = child.result.to_json()
    assert d["loader"] == {"batch_size": 16, "num_workers": 1, "pin_memory": False, "prefetch_factor": 4,
                           "persistent_workers": True, "drop_last": True}
    assert d["applied"]["autocast_dtype"] == "bfloat16" and d["applied"]["grad_scaler"] is False
    assert d["applied"]["torch_threads"] == 1 and d["applied"]["accumulation_steps"] == 2
    assert d["effective_batch_size"] == 32
    eff = d["knobs_effective"]
    assert (eff["amp"], eff["intra_op_threads"], eff["compile"]) == ("bf16", 1, "off")


def test_fp16_on_cpu_is_invalid_not_a_crash():
    child = burst(amp="fp16")
    assert child.outcome == "invalid" and "needs CUDA" in child.failure


def test_batch_larger_than_the_data_is_invalid():
    child = burst(batch_size=4096)
    assert child.outcome == "invalid"
    assert "burst too short" in child.failure or "larger than the training set" in child.failure


def test_nan_is_caught_with_its_step():
    child = burst("kt_test_workloads:diverge", options={"after": 7})
    assert child.outcome == "nan", child.failure
    assert child.result.nan_step == 7
    assert "non-finite at step 7" in child.failure
    assert child.result.val_accuracy is None


def test_abort_is_a_crash_with_the_output_tail():
    child = burst("kt_test_workloads:abort")
    assert child.outcome == "crash"
    assert child.returncode is not None and child.returncode < 0
    assert "SIGABRT" in child.failure


def test_python_exception_is_a_crash_with_the_traceback_tail():
    child = burst("kt_test_workloads:eval_limit", options={"limit": 1}, amp="bf16")
    assert child.outcome == "crash" and "exited with status 1" in child.failure
    assert "ValueError: evaluation batch of" in child.failure
    # the one-line views (the progress line, a failed baseline's message) name the exception too
    assert "ValueError: evaluation batch of" in child.reason()


def test_a_value_the_knob_does_not_take_is_invalid_naming_the_knob():
    child = burst("kt_test_workloads:tiny", options={"train": 320, "val": 160, "batch_size": 32},
                  batch_size="thirty-two")
    assert child.outcome == "invalid" and "batch_size='thirty-two': expected an integer" in child.failure


def test_timeout_kills_the_whole_process_group():
    child = burst("kt_test_workloads:sleepy", timeout=8, num_workers=2, persistent_workers=True)
    assert child.outcome == "timeout" and "timeout_s=8" in child.failure
    assert group_members(child.pgid) == []  # workers included, gone when run_child returns


def test_bad_user_workloads_are_errors_not_crashes():
    child = burst("kt_test_workloads:not_a_workload")
    assert child.outcome == "error" and "returned builtins.int, expected knobtune.pytorch.Workload" in child.failure
    child = burst("kt_broken_module:factory")
    assert child.outcome == "error" and "cannot import module 'kt_broken_module'" in child.failure
    child = burst("kt_test_workloads:needs_option", options={"colour": "red"})
    assert child.outcome == "error" and "does not take options ['colour']" in child.failure


@pytest.mark.slow
def test_compile_reports_what_dynamo_really_did():
    # a model with a graph break in forward: compiled, in two graphs, and the report says why
    child = burst("kt_test_workloads:graph_break", compile="default", timeout=300)
    assert child.outcome == "ok", child.failure
    report = child.result.applied["compile_report"]
    assert child.result.applied["compiled"] is True and child.result.knobs_effective["compile"] == "default"
    assert report["graphs"] >= 2 and report["graph_breaks"] >= 1 and report["eager_fallback"] is False
    assert report["break_reasons"] and "graph break" in report["note"]
    assert report["recompiles"] == 0  # drop_last: every step has the same shape
