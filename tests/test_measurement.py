"""The measurement protocol on real PyTorch children: steady-state windows after a slow warm-up,
short windows reported, a guard that costs no device op per step, the same augmentation stream
whatever num_workers is, bounded evaluation inside the OOM handling, outcome classes, versions."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from knobtune.search.launch.runner import run_child
from knobtune.spaces import for_framework
from knobtune.trainers.common.wire import Burst, Request

from conftest import WORKLOADS, knobtune, study_file

CPU_CTX = {"hardware": {"cuda": False, "bf16": True, "usable_cores": 2}, "workload": {"batch_size": 32}}
BURST = Burst(train_samples=640, warmup_samples=64, windows=3)


def knobs(**overrides: Any) -> dict[str, Any]:
    return {**for_framework("pytorch").defaults(CPU_CTX), **overrides}


def burst(workload: str, burst_spec: Burst | None = None, timeout: float = 120, options=None,
          **overrides: Any):
    request = Request(workload=workload, workload_options=options or {}, knobs=knobs(**overrides),
                      burst=burst_spec or BURST)
    return run_child("pytorch", "burst", request, timeout)


def inspect(command: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "kt_inspect", command], capture_output=True, text=True,
                          timeout=300, cwd=WORKLOADS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# 2 ms per sample, batches of 16, 2 workers: the pipeline gives about 1,000 samples/s. Each worker
# prefetches 24 batches, so 48 batches (768 samples) pile up during a slow warm-up: more than the
# windows that follow hold. Without the settle segment they would be trained at compute speed
# (measured with a settle capped too early: 2,195 samples/s against 759).
SLOW = Burst(train_samples=64 + 100 * 16, warmup_samples=64, windows=3)


def test_read_ahead_piled_up_during_warm_up_is_not_measured():
    rates = {}
    for warmup_cost in (0.0, 3.0):
        child = burst("kt_test_workloads:slow_input", SLOW, options={"warmup_cost": warmup_cost}, batch_size=16,
                      num_workers=2, prefetch_factor=24, persistent_workers=True, intra_op_threads=1)
        assert child.outcome == "ok", child.failure
        d = child.result.to_json()
        rates[warmup_cost] = d["samples_per_second"]
        assert d["settle_samples"] > 0 and d["trained_samples"] == SLOW.train_samples
        if warmup_cost:  # the queue was full when warm-up ended; the settle segment emptied it
            assert d["warmup_seconds"] > warmup_cost and d["settle_drained"] is True
            assert d["settle_samples"] >= 24 * 16  # at least half the read-ahead was trained through
            assert "unsettled" not in d
    # the same pipeline measures the same steady rate, slow warm-up or not (the read-ahead alone
    # would have made the windows after the slow warm-up several times faster)
    assert 0.6 < rates[3.0] / rates[0.0] < 1.6, rates  # (without the settle: about 3x)


def test_short_windows_are_reported_with_the_burst_that_would_fix_them():
    child = burst("kt_test_workloads:tiny", replace(BURST, min_window_seconds=30.0))
    assert child.outcome == "ok", child.failure
    short = child.result.short_windows
    assert short["min_window_seconds"] == 30.0 and short["shortest_seconds"] < 30.0
    assert short["suggested_train_samples"] > BURST.train_samples
    assert burst("kt_test_workloads:tiny", replace(BURST, min_window_seconds=0.0)).result.short_windows is None


def test_the_nan_guard_adds_one_device_op_per_step():
    # the old guard launched about nine (isfinite, logical_or, where, copy, add, ...); now the
    # loss is copied into a preallocated buffer, read only at the boundary
    ops = inspect("guard_ops")
    assert ops["per_step_guard_on"] == ops["per_step_guard_off"] + 1 and ops["per_step_guard_off"] > 0
    assert ops["finite"] is True and ops["mean_loss"] > 0


def test_augmentation_stream_is_the_same_whatever_num_workers_is():
    seen = inspect("augment")
    assert seen["batches"] == 6 and seen["same_with_workers"] is True
    assert seen["epochs_differ"] is True and seen["other_seed_differs"] is True


def test_training_is_the_same_with_and_without_workers():
    # the same samples, augmentation and dropout masks in the same order: the same model
    alone = burst("kt_test_workloads:tiny")
    workers = burst("kt_test_workloads:tiny", num_workers=2, persistent_workers=True)
    assert alone.outcome == workers.outcome == "ok", (alone.failure, workers.failure)
    # (final_loss is the last window's mean, and the windows differ: workers have a settle segment)
    assert alone.result.trained_samples == workers.result.trained_samples
    assert alone.result.val_accuracy == workers.result.val_accuracy


def test_evaluation_runs_in_the_trials_batches():
    # the model refuses evaluation batches over 16: evaluating at a fixed 512 would crash
    child = burst("kt_test_workloads:eval_limit", options={"limit": 16}, batch_size=16)
    assert child.outcome == "ok", child.failure
    assert child.result.applied["eval_batch_size"] == 16 and child.result.val_accuracy > 0


@pytest.mark.parametrize("where", ["eval", "build"])
def test_out_of_memory_in_evaluation_or_setup_is_oom_not_a_crash(where: str):
    child = burst("kt_test_workloads:oom_in", options={"where": where})
    assert child.outcome == "oom", (child.outcome, child.failure)
    assert "simulated" in child.failure


def test_a_dataloader_worker_killed_by_sigkill_is_oom():
    child = burst("kt_test_workloads:worker_killed", num_workers=1)
    assert child.outcome == "oom", (child.outcome, child.failure)
    assert "SIGKILL" in child.failure


def test_a_result_already_written_survives_a_slow_teardown():
    child = burst("kt_test_workloads:slow_exit", timeout=60)
    assert child.outcome == "ok", (child.outcome, child.failure)
    assert child.wall_seconds < 60


def test_channels_last_is_read_from_the_convolution_weights():
    child = burst("digits-cnn", channels_last=True, batch_size=32)
    assert child.outcome == "ok", child.failure
    assert child.result.knobs_effective["channels_last"] is True
    assert burst("digits-cnn", batch_size=32).result.knobs_effective["channels_last"] is False


def test_an_old_torch_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text('__version__ = "2.3.1+cu121"\n')
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    child = run_child("pytorch", "probe", Request(), 60)
    assert child.outcome == "error"
    assert "torch 2.3.1+cu121 is too old" in child.failure and "torch>=2.5" in child.failure
    study = study_file(tmp_path, """
        [study]
        framework = "pytorch"
        workload = "digits-mlp"
        """)
    proc = knobtune("run", str(study), cwd=tmp_path, check=2)
    assert proc.stderr.strip().splitlines()[-1].startswith("knobtune: error: torch 2.3.1+cu121 is too old")
    assert "Traceback" not in proc.stderr


def test_version_parsing():
    from knobtune.trainers.common.versions import REQUIREMENTS, parse, too_old

    torch_req = REQUIREMENTS["pytorch"][0]
    assert parse("2.13.0+cpu") == (2, 13, 0) and parse("2.5.0a0+git1234") == (2, 5, 0)
    assert too_old(torch_req, "2.13.0+cpu") is None and too_old(torch_req, "2.5.0") is None
    assert "too old" in too_old(torch_req, "2.4.1")
