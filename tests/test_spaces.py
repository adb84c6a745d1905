"""Knob spaces: what is offered on which hardware, conditions, narrowing, reasons."""
from __future__ import annotations

import random

from spaces import for_framework

CPU = {"hardware": {"device": "cpu", "cuda": False, "bf16": True, "usable_cores": 2},
       "workload": {"batch_size": 64, "conv": False}}
CUDA = {"hardware": {"device": "cuda", "cuda": True, "bf16": True, "tf32": True, "usable_cores": 16},
        "workload": {"batch_size": 64, "conv": True}}
SPACE = for_framework("pytorch")


def test_cuda_only_knobs_are_not_offered_on_cpu_and_say_why():
    offer = SPACE.offer(CPU, {}, {})
    for knob in ("pin_memory", "cudnn_benchmark", "cudnn_deterministic", "matmul_precision"):
        assert knob not in offer.choices and "CUDA" in offer.unavailable[knob]
    assert offer.choices["amp"] == ["off", "bf16"]
    assert "reduce-overhead" not in offer.choices["compile"]
    assert offer.choices["num_workers"] == [0, 1, 2]
    assert "channels_last" in offer.unavailable  # an MLP has no convolutions


def test_cuda_offers_everything():
    offer = SPACE.offer(CUDA, {}, {})
    assert not offer.unavailable
    assert offer.choices["amp"] == ["off", "bf16", "fp16"]
    assert offer.choices["compile"] == ["off", "default", "reduce-overhead", "max-autotune"]
    assert offer.choices["num_workers"] == [0, 1, 2, 4, 8, 16]


def test_no_bf16_device_drops_bf16():
    ctx = {"hardware": {**CUDA["hardware"], "bf16": False}, "workload": CUDA["workload"]}
    assert SPACE.offer(ctx, {}, {}).choices["amp"] == ["off", "fp16"]


def test_narrowing_drops_what_cannot_run_here_and_keeps_the_baseline():
    offer = SPACE.offer(CPU, {"num_workers": [1, 4], "amp": ["fp16", "bf16"], "batch_size": [128, 256]},
                        {"batch_size": 32})
    assert offer.choices["num_workers"] == [0, 1]  # 4 > 2 cores dropped; baseline 0 kept
    assert offer.choices["amp"] == ["bf16", "off"]
    assert offer.choices["batch_size"] == [32, 128, 256]
    assert any("cores" in note for note in offer.dropped["num_workers"])
    assert any("CUDA" in note for note in offer.dropped["amp"])


class Recorder:
    """A stand-in for optuna.Trial that picks the last choice and records what was asked."""

    def __init__(self) -> None:
        self.asked: dict[str, list] = {}

    def suggest_categorical(self, name, choices):
        self.asked[name] = list(choices)
        return choices[-1]


def test_worker_knobs_are_only_suggested_with_workers():
    offer = SPACE.offer(CPU, {"num_workers": [0]}, {})
    trial = Recorder()
    values = SPACE.suggest(trial, offer)
    assert "prefetch_factor" not in trial.asked and "persistent_workers" not in trial.asked
    resolved = SPACE.resolve(values, offer, CPU)
    assert resolved["prefetch_factor"].applied is False and "num_workers > 0" in resolved["prefetch_factor"].why
    assert resolved["pin_memory"].why.startswith("needs CUDA")
    trial = Recorder()
    SPACE.suggest(trial, SPACE.offer(CPU, {}, {}))
    assert "prefetch_factor" in trial.asked  # last num_workers choice is 2


def test_baseline_is_the_framework_defaults_plus_overrides():
    offer = SPACE.offer(CPU, {}, {"batch_size": 128})
    params = SPACE.baseline_params(offer, CPU, {"batch_size": 128})
    assert params == {"batch_size": 128, "accumulation_steps": 1, "num_workers": 0,
                      "intra_op_threads": 0, "amp": "off", "compile": "off"}


def test_advice_follows_the_seeds_on_cuda():
    offer = SPACE.offer(CUDA, {}, {})
    advice = SPACE.advice_params(offer, CUDA, {})
    assert advice["num_workers"] == 8 and advice["pin_memory"] is True
    # bf16 where the GPU has it (no loss scaling), fp16 with GradScaler only where it has not
    assert advice["amp"] == "bf16" and advice["cudnn_benchmark"] is True and advice["compile"] == "default"
    old_gpu = {"hardware": {**CUDA["hardware"], "bf16": False, "tf32": False}, "workload": CUDA["workload"]}
    assert SPACE.advice_params(SPACE.offer(old_gpu, {}, {}), old_gpu, {})["amp"] == "fp16"


def test_cudnn_flags_are_offered_only_for_models_with_convolutions():
    mlp = {"hardware": CUDA["hardware"], "workload": {"batch_size": 64, "conv": False}}
    offer = SPACE.offer(mlp, {}, {})
    for knob in ("cudnn_benchmark", "cudnn_deterministic", "channels_last"):
        assert knob not in offer.choices and "convolutions" in offer.unavailable[knob]
    assert "cudnn_benchmark" in SPACE.offer(CUDA, {}, {}).choices


def test_matmul_precision_is_searched_only_where_it_can_change_something():
    offer = SPACE.offer(CUDA, {}, {})
    assert offer.choices["matmul_precision"] == ["highest", "high"]
    # under autocast the matmuls run in bf16/fp16: the fp32 precision is not asked
    trial = Recorder()
    values = SPACE.suggest(trial, SPACE.offer(CUDA, {"amp": ["bf16"]}, {"amp": "bf16"}))
    assert "matmul_precision" not in trial.asked and "matmul_precision" not in values
    resolved = SPACE.resolve(values, SPACE.offer(CUDA, {"amp": ["bf16"]}, {"amp": "bf16"}), CUDA)
    assert resolved["matmul_precision"].applied is False and "bf16" in resolved["matmul_precision"].why
    pre_ampere = {"hardware": {**CUDA["hardware"], "tf32": False}, "workload": CUDA["workload"]}
    assert "Ampere" in SPACE.offer(pre_ampere, {}, {}).unavailable["matmul_precision"]


def test_cuda_graphs_with_accumulation_are_invalid_on_cuda_only():
    for mode in ("reduce-overhead", "max-autotune"):
        why = SPACE.invalid({"compile": mode, "accumulation_steps": 2}, CUDA)
        assert why and "accumulation_steps=2" in why and "CUDA graphs" in why
        assert SPACE.invalid({"compile": mode, "accumulation_steps": 1}, CUDA) is None
    assert SPACE.invalid({"compile": "default", "accumulation_steps": 4}, CUDA) is None
    assert SPACE.invalid({"compile": "max-autotune", "accumulation_steps": 2}, CPU) is None  # no CUDA graphs


def test_tensorflow_tf32_knob_follows_the_gpu_and_the_policy():
    tf_space = for_framework("tensorflow")
    gpu = {"hardware": {"gpu": True, "cuda": True, "bf16": True, "tf32": True, "usable_cores": 8},
           "workload": {"batch_size": 64}}
    assert tf_space.offer(gpu, {}, {}).choices["tf32"] == [True, False]
    assert "no GPU" in tf_space.offer(CPU, {}, {}).unavailable["tf32"]
    offer = tf_space.offer(gpu, {"mixed_precision": ["mixed_bfloat16"]}, {"mixed_precision": "mixed_bfloat16"})
    resolved = tf_space.resolve(tf_space.suggest(Recorder(), offer), offer, gpu)
    assert resolved["tf32"].applied is False and "16 bits" in resolved["tf32"].why


def test_grid_and_random_params_respect_conditions():
    offer = SPACE.offer(CPU, {"batch_size": [64], "accumulation_steps": [1], "amp": ["off"],
                              "compile": ["off"], "intra_op_threads": [0]}, {})
    grid = list(SPACE.grid(offer))
    # workers 0: 1 config; workers 1 or 2: 3 prefetch x 2 persistent each
    assert len(grid) == 1 + 2 * 3 * 2
    rng = random.Random(0)
    for _ in range(50):
        params = SPACE.random_params(offer, rng)
        assert ("prefetch_factor" in params) == (params["num_workers"] > 0)


def test_the_workloads_own_batch_size_is_the_baseline_not_the_knob_default():
    ctx = {**CPU, "workload": {"batch_size": 32, "conv": False}}
    offer = SPACE.offer(ctx, {"batch_size": [16, 32]}, {})
    assert offer.choices["batch_size"] == [16, 32]
    assert SPACE.baseline_params(offer, ctx, {})["batch_size"] == 32
