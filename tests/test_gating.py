"""On this machine: GPU-only paths are gated off, and say why, before any CUDA code runs."""
from __future__ import annotations

import pytest

from knobtune.search.launch.runner import run_child
from knobtune.spaces.pytorch import DDP_KNOBS
from knobtune.trainers.common.wire import Burst, Request

from conftest import torch_cuda

ON_CUDA = torch_cuda()


@pytest.mark.skipif(ON_CUDA, reason="checks the CPU-only gating")
def test_probe_on_cpu_offers_no_cuda_knobs():
    child = run_child("pytorch", "probe", Request(workload="digits-cnn"), 120)
    assert child.outcome != "crash", child.failure
    hw = child.result.fingerprint["hardware"]
    assert hw == {**hw, "device": "cpu", "cuda": False, "fp16": False}
    assert child.result.workload["conv"] is True and child.result.workload["parameters"] > 100_000
    from knobtune.spaces import for_framework

    offer = for_framework("pytorch").offer({"hardware": hw, "workload": child.result.workload}, {}, {})
    assert set(offer.unavailable) == {"pin_memory", "cudnn_benchmark", "cudnn_deterministic", "matmul_precision",
                                      "expandable_segments", "group_by_length", *DDP_KNOBS, "nccl_algo",
                                      "nccl_proto"}
    assert "CUDA" in offer.unavailable["expandable_segments"]
    assert "fp16" not in offer.choices["amp"] and "channels_last" in offer.choices
    # the probe stepped the workload's Adam with each implementation on this CPU (torch 2.13 has fused CPU Adam)
    assert child.result.workload["optimizer"] == "Adam"
    assert offer.choices["optimizer_impl"] == ["default", "foreach", "fused"]
    assert offer.choices["dataloader_in_order"] == [True, False]


@pytest.mark.skipif(ON_CUDA, reason="checks gloo's gating")
def test_a_data_parallel_probe_offers_the_ddp_knobs_and_the_hooks_its_backend_takes():
    child = run_child("pytorch", "probe", Request(workload="digits-resnet", nproc=2), 120)
    assert child.outcome == "ok", child.failure
    workload = child.result.workload
    # tried on a one-rank gloo group: fp16 compression runs, bf16's hook refuses anything but NCCL
    assert workload["distributed"] == {"nproc": 2, "backend": "gloo", "comm_hooks": ["none", "fp16"]}
    assert workload["buffers"] > 0  # the ResNet's batch norm
    from knobtune.spaces import for_framework

    offer = for_framework("pytorch").offer({"hardware": child.result.fingerprint["hardware"], "workload": workload},
                                           {}, {})
    assert not set(DDP_KNOBS) & set(offer.unavailable)
    assert offer.choices["ddp_comm_hook"] == ["none", "fp16"]
    assert offer.choices["ddp_broadcast_buffers"] == [True, False]
    mlp = {**workload, "buffers": 0}
    assert "no buffers" in for_framework("pytorch").offer({"hardware": {}, "workload": mlp}, {}, {}).unavailable[
        "ddp_broadcast_buffers"]


@pytest.mark.skipif(ON_CUDA, reason="checks the CPU-only gating")
def test_cuda_only_values_are_refused_by_the_child_on_cpu():
    from knobtune.spaces import for_framework

    ctx = {"hardware": {"cuda": False, "bf16": True, "usable_cores": 2}, "workload": {"batch_size": 32}}
    knobs = {**for_framework("pytorch").defaults(ctx), "amp": "fp16"}
    child = run_child("pytorch", "burst", Request(workload="kt_test_workloads:tiny", knobs=knobs,
                                                  burst=Burst(train_samples=640, warmup_samples=64, windows=3)), 120)
    assert child.outcome == "invalid" and "needs CUDA" in child.failure


@pytest.mark.tensorflow
@pytest.mark.skipif(ON_CUDA, reason="checks the CPU-only gating")
def test_tensorflow_probe_on_cpu_gates_the_gpu_thread_mode_off_and_says_why():
    child = run_child("tensorflow", "probe", Request(workload="digits-mlp"), 180)
    assert child.outcome != "crash", child.failure
    hw = child.result.fingerprint["hardware"]
    from knobtune.spaces import for_framework

    offer = for_framework("tensorflow").offer({"hardware": hw, "workload": child.result.workload}, {}, {})
    assert hw["gpu"] is False and "no GPU" in offer.unavailable["gpu_thread_mode"]
    assert "no GPU" in offer.unavailable["tf32"] and "gpu_thread_mode" not in offer.choices
    # the CPU can use the others: auto-clustering (with jit_compile off, the CPU's default) and the tf.data options
    assert offer.choices["xla_auto_clustering"] == [False, True]
    assert offer.choices["map_parallelization"] == [True, False] and 0 in offer.choices["private_threadpool_size"]
