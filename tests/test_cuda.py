"""CUDA paths: run on a CUDA box (`make test-cuda`), skipped elsewhere (see conftest)."""
from __future__ import annotations

from typing import Any

import pytest

from search.runner import run_child
from spaces import for_framework

pytestmark = pytest.mark.cuda
BURST = {"train_samples": 2048, "warmup_samples": 256, "windows": 4, "seed": 0}
CTX = {"hardware": {"cuda": True, "bf16": True, "usable_cores": 4}, "workload": {"batch_size": 64}}


def burst(workload: str = "digits-cnn", timeout: float = 300, **overrides: Any):
    knobs = {**for_framework("pytorch").defaults(CTX), **overrides}
    return run_child("pytorch", "burst", {"workload": workload, "knobs": knobs, "burst": BURST}, timeout)


def test_fp16_uses_a_grad_scaler_and_reports_skips():
    child = burst(amp="fp16")
    assert child.outcome == "ok", child.failure
    assert child.data["applied"]["grad_scaler"] is True and child.data["applied"]["autocast_dtype"] == "float16"
    assert child.data["amp_skipped_steps"] >= 0 and child.data["val_accuracy"] > 0.3


def test_cudnn_flags_pin_memory_and_channels_last_are_applied():
    child = burst(cudnn_benchmark=True, cudnn_deterministic=False, pin_memory=True, channels_last=True,
                  num_workers=2, persistent_workers=True)
    assert child.outcome == "ok", child.failure
    eff = child.data["knobs_effective"]
    assert eff["cudnn_benchmark"] is True and eff["cudnn_deterministic"] is False
    assert eff["pin_memory"] is True and eff["channels_last"] is True
    assert child.data["peak_memory_mb"] > 0 and child.data["applied"]["device"] == "cuda"


def test_bf16_on_cuda():
    child = burst(amp="bf16")
    assert child.outcome == "ok", child.failure
    assert child.data["knobs_effective"]["amp"] == "bf16"


def test_compile_with_cuda_graphs():
    child = burst(compile="reduce-overhead", timeout=600)
    assert child.outcome == "ok", child.failure
    assert child.data["applied"]["compiled"] is True and child.data["knobs_effective"]["compile"] == "reduce-overhead"


def test_probe_reports_the_gpu():
    child = run_child("pytorch", "probe", {"workload": None}, 120)
    fp = child.data["fingerprint"]
    assert fp["cuda_available"] is True and fp["gpus"] and fp["gpus"][0]["memory_mb"] > 0
    assert fp["cudnn_version"] and fp["hardware"]["fp16"] is True
