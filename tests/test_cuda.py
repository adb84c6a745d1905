"""CUDA paths: run on a CUDA box (`make test-cuda`, benchmarks/gpu_check.sh), skipped elsewhere
(see conftest). Each asserts behaviour the device shows, not a value knobtune set itself."""
from __future__ import annotations

from typing import Any

import pytest

from knobtune.search.launch.runner import run_child
from knobtune.spaces import for_framework
from knobtune.trainers.common.wire import Burst, Request

# (the server tests read the pids of the servers this process started itself)
pytestmark = [pytest.mark.cuda, pytest.mark.usefixtures("private_fork_servers")]

BURST = Burst(train_samples=2048, warmup_samples=256, windows=4)
CTX = {"hardware": {"cuda": True, "bf16": True, "tf32": True, "usable_cores": 4}, "workload": {"batch_size": 64}}


def burst(workload: str = "digits-cnn", timeout: float = 300, options: dict[str, Any] | None = None,
          spec: Burst | None = None, **overrides: Any):
    knobs = {**for_framework("pytorch").defaults(CTX), **overrides}
    request = Request(workload=workload, workload_options=options or {}, knobs=knobs, burst=spec or BURST)
    return run_child("pytorch", "burst", request, timeout)


def strict_burst(**overrides: Any):
    """A burst whose windows run under torch.cuda.set_sync_debug_mode("error"): any host-device
    synchronisation inside a window raises, and the trial crashes."""
    knobs = {**for_framework("pytorch").defaults(CTX), **overrides}
    request = Request(workload="digits-cnn", knobs=knobs, burst=BURST, sync_debug=True)
    return run_child("pytorch", "burst", request, 300)


def test_the_default_training_path_never_syncs_inside_a_window():
    # pinned host batches (a pageable host-to-device copy is synchronous by nature)
    child = strict_burst(pin_memory=True, num_workers=2, persistent_workers=True)
    assert child.outcome == "ok", child.failure
    assert child.result.applied["per_step_sync"] is None and child.result.val_accuracy > 0.3
    # the memory headroom: the peak allocated on the device against the device's total memory
    assert 0 < child.result.peak_memory_mb < child.result.memory_limit_mb


def test_fp16_with_adam_steps_without_a_sync_through_the_fused_optimizer():
    child = strict_burst(amp="fp16", pin_memory=True, num_workers=2, persistent_workers=True)
    assert child.outcome == "ok", child.failure
    applied = child.result.applied
    assert applied["grad_scaler"] is True and applied["fused_optimizer_for_grad_scaler"] is True
    assert applied["per_step_sync"] is None


def test_fp16_skips_are_counted_when_the_scale_overflows():
    # logits scaled by 1e4: with GradScaler's initial scale (65536) the fp16 backward overflows,
    # the step is skipped and the scale halves, until it fits; those skips must be counted
    child = burst("kt_test_workloads:loud", amp="fp16", options={"gain": 1e4})
    assert child.outcome == "ok", child.failure
    assert child.result.amp_skipped_steps >= 1
    quiet = burst("kt_test_workloads:loud", amp="fp16", options={"gain": 1.0})
    assert quiet.outcome == "ok" and quiet.result.amp_skipped_steps < child.result.amp_skipped_steps


def test_cuda_graphs_are_replayed_by_reduce_overhead():
    child = burst(compile="reduce-overhead", timeout=600)
    assert child.outcome == "ok", child.failure
    report = child.result.applied["compile_report"]
    assert report["cudagraph_skips"] == 0 and child.result.knobs_effective["compile"] == "reduce-overhead"
    # every measured step after warm-up replays its recorded forward and backward graphs
    measured_steps = sum(child.result.window_samples) // 64
    assert report["cudagraph_replays"] >= 2 * measured_steps


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_cuda_graphs_with_accumulation_are_refused_before_training(mode: str):
    child = burst(compile=mode, accumulation_steps=2, timeout=120)
    assert child.outcome == "invalid", (child.outcome, child.failure)
    assert "accumulation_steps=2" in child.failure


def test_cudnn_flags_pin_memory_and_channels_last_are_applied():
    child = burst(cudnn_benchmark=True, cudnn_deterministic=False, pin_memory=True, channels_last=True,
                  num_workers=2, persistent_workers=True)
    assert child.outcome == "ok", child.failure
    eff = child.result.knobs_effective
    assert eff["cudnn_benchmark"] is True and eff["cudnn_deterministic"] is False
    assert eff["pin_memory"] is True and eff["channels_last"] is True
    assert child.result.applied["device"] == "cuda"


def test_tf32_matmuls_change_the_arithmetic():
    # the same seed and data: two IEEE fp32 runs agree to the bit, a TF32 run (mantissa rounded
    # to 10 bits in the matmuls) does not, so the knob really reaches the device
    first, second = burst("digits-mlp", matmul_precision="highest"), burst("digits-mlp", matmul_precision="highest")
    tf32 = burst("digits-mlp", matmul_precision="high")
    assert first.outcome == second.outcome == tf32.outcome == "ok", (first.failure, tf32.failure)
    assert tf32.result.knobs_effective["matmul_precision"] == "high"
    assert first.result.final_loss == second.result.final_loss != tf32.result.final_loss


def test_probe_reports_the_gpu():
    child = run_child("pytorch", "probe", Request(), 120)
    fp = child.result.fingerprint
    assert fp["cuda_available"] is True and fp["gpus"] and fp["gpus"][0]["memory_mb"] > 0
    assert fp["cudnn_version"] and fp["hardware"]["fp16"] is True


def test_without_a_config_the_scripts_own_cuda_settings_stay():
    import os
    import subprocess
    import sys

    code = ("import torch; torch.backends.cudnn.benchmark = True; torch.set_float32_matmul_precision('high'); "
            "from knobtune.pytorch import Tuned; Tuned.load(); "
            "print(torch.backends.cudnn.benchmark, torch.get_float32_matmul_precision())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "KNOBTUNE_CONFIG": ""})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "high"]


def test_forked_children_each_set_up_cuda_and_cudnn_their_own_way():
    """Children forked from the warm server each create their own CUDA context and read back their
    own cuDNN flags; the server itself never holds the GPU."""
    import shutil
    import subprocess

    from knobtune.search.launch import forkserver

    seen = []
    for benchmark, precision in ((True, "high"), (False, "highest"), (True, "highest")):
        child = burst(cudnn_benchmark=benchmark, matmul_precision=precision)
        assert child.outcome == "ok", child.failure
        assert child.result.child_start == "forked"
        applied = child.result.applied
        seen.append((applied["cudnn_benchmark"], applied["matmul_precision"]))
    assert seen == [(True, "high"), (False, "highest"), (True, "highest")]
    servers = {s.proc.pid for k, s in forkserver._servers.items()
               if k[0] == "pytorch" and not isinstance(s, forkserver.SharedServer)}
    if servers and shutil.which("nvidia-smi"):
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                              capture_output=True, text=True).stdout.split()
        assert not servers & {int(p) for p in apps if p.isdigit()}


def test_expandable_segments_reach_the_cuda_caching_allocator():
    # read back from the allocator's own segments (torch.cuda.memory_snapshot: is_expandable)
    plain, expandable = burst(), burst(expandable_segments=True)
    assert plain.outcome == expandable.outcome == "ok", (plain.failure, expandable.failure)
    assert plain.result.knobs_effective["expandable_segments"] is False
    assert expandable.result.knobs_effective["expandable_segments"] is True


def test_optimizer_impl_fused_and_foreach_on_cuda():
    for impl in ("fused", "foreach"):
        child = burst(optimizer_impl=impl)
        assert child.outcome == "ok", child.failure
        assert child.result.knobs_effective["optimizer_impl"] == impl and child.result.applied["optimizer"] == "Adam"
    # fp16 keeps the fused twin for GradScaler by default: no host read per step
    child = strict_burst(amp="fp16", pin_memory=True, num_workers=2, persistent_workers=True, optimizer_impl="fused")
    assert child.outcome == "ok", child.failure
    assert child.result.applied["per_step_sync"] is None and child.result.knobs_effective["optimizer_impl"] == "fused"


def test_probe_offers_the_new_cuda_knobs():
    child = run_child("pytorch", "probe", Request(workload="digits-cnn"), 120)
    ctx = {"hardware": child.result.fingerprint["hardware"], "workload": child.result.workload}
    offer = for_framework("pytorch").offer(ctx, {}, {})
    assert offer.choices["expandable_segments"] == [False, True]
    assert offer.choices["optimizer_impl"] == ["default", "foreach", "fused"]
    assert offer.choices["dataloader_in_order"] == [True, False]
