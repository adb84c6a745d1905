"""Knob spaces: what is offered on which hardware, conditions, narrowing, reasons."""
from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from knobtune.spaces import for_framework
from knobtune.spaces.pytorch import DDP_KNOBS

ADAM = {"optimizer": "Adam", "optimizer_impls": ["default", "foreach", "fused"]}  # as the probe tried it
CPU = {"hardware": {"device": "cpu", "cuda": False, "bf16": True, "usable_cores": 2, "loader_in_order": True},
       "workload": {"batch_size": 64, "conv": False, **ADAM}}
CUDA = {"hardware": {"device": "cuda", "cuda": True, "bf16": True, "tf32": True, "usable_cores": 16,
                     "loader_in_order": True},
        "workload": {"batch_size": 64, "conv": True, **ADAM}}
SPACE = for_framework("pytorch")


def test_cuda_only_knobs_are_not_offered_on_cpu_and_say_why():
    offer = SPACE.offer(CPU, {}, {})
    for knob in ("pin_memory", "cudnn_benchmark", "cudnn_deterministic", "matmul_precision", "expandable_segments"):
        assert knob not in offer.choices and "CUDA" in offer.unavailable[knob]
    assert offer.choices["amp"] == ["off", "bf16"]
    assert "reduce-overhead" not in offer.choices["compile"]
    assert offer.choices["num_workers"] == [0, 1, 2]
    assert "channels_last" in offer.unavailable  # an MLP has no convolutions


def test_cuda_offers_everything():
    offer = SPACE.offer(CUDA, {}, {})
    # a built-in workload has no Trainer to group batches; one process has no DistributedDataParallel
    assert set(offer.unavailable) == {"group_by_length", *DDP_KNOBS, "nccl_algo", "nccl_proto"}
    assert all("nproc" in offer.unavailable[k] for k in (*DDP_KNOBS, "nccl_algo"))


def test_a_data_parallel_study_on_cuda_searches_ddp_and_nccls_settings_and_exports_them():
    group = {"distributed": {"nproc": 8, "backend": "nccl", "comm_hooks": ["none", "fp16", "bf16"]}, "buffers": 0}
    ctx = {**CUDA, "workload": {**CUDA["workload"], **group}}
    offer = SPACE.offer(ctx, {}, {})
    assert offer.choices["ddp_comm_hook"] == ["none", "fp16", "bf16"]
    assert offer.choices["nccl_algo"] == ["default", "Ring", "Tree"]
    assert "no buffers" in offer.unavailable["ddp_broadcast_buffers"]
    gloo = {**ctx, "workload": {**ctx["workload"], "distributed": {**group["distributed"], "backend": "gloo"}}}
    assert "is not NCCL" in SPACE.offer(gloo, {}, {}).unavailable["nccl_proto"]
    from knobtune.spaces.knobs import Shown

    knobs = {**SPACE.defaults(ctx), "nccl_algo": "Tree", "ddp_bucket_cap_mb": 100, "ddp_comm_hook": "bf16"}
    script = SPACE.script(Shown(SPACE, knobs, set(), lambda setter: []))
    assert "os.environ['NCCL_ALGO'] = 'Tree'  # before the process group starts" in script
    assert script.index("NCCL_ALGO") < script.index("init_process_group")
    assert "bucket_cap_mb=100" in script and "default_hooks.bf16_compress_hook" in script
    compile(script, "snippet.py", "exec")
    assert offer.choices["amp"] == ["off", "bf16", "fp16"]
    assert offer.choices["compile"] == ["off", "default", "reduce-overhead", "max-autotune"]
    assert offer.choices["num_workers"] == [0, 1, 2, 4, 8, 16]


def test_group_by_length_is_offered_to_a_trainer_whose_samples_differ_in_length():
    def offer(**workload):
        return SPACE.offer({"hardware": CPU["hardware"], "workload": {**CPU["workload"], **workload}}, {}, {})

    grouped = offer(integration="transformers.Trainer", variable_lengths=True)
    assert grouped.choices["group_by_length"] == [False, True] and "group_by_length" not in grouped.unavailable
    same = offer(integration="transformers.Trainer", variable_lengths=False)
    assert "same length" in same.unavailable["group_by_length"]
    assert "Trainer" in offer(integration="lightning.Trainer", variable_lengths=True).unavailable["group_by_length"]


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
    # (dataloader_in_order is not asked without workers; optimizer_impl's default is the optimizer as built)
    assert params == {"batch_size": 128, "accumulation_steps": 1, "num_workers": 0,
                      "intra_op_threads": 0, "amp": "off", "compile": "off", "optimizer_impl": "default"}


def test_advice_follows_the_seeds_on_cuda():
    offer = SPACE.offer(CUDA, {}, {})
    advice = SPACE.advice_params(offer, CUDA, {})
    assert advice["num_workers"] == 8 and advice["pin_memory"] is True
    # bf16 where the GPU has it (no loss scaling), fp16 with GradScaler only where it has not
    assert advice["amp"] == "bf16" and advice["cudnn_benchmark"] is True and advice["compile"] == "default"
    old_gpu = {"hardware": {**CUDA["hardware"], "bf16": False, "tf32": False}, "workload": CUDA["workload"]}
    assert SPACE.advice_params(SPACE.offer(old_gpu, {}, {}), old_gpu, {})["amp"] == "fp16"


def test_on_a_cpu_the_advice_asks_for_bf16_only_where_it_is_done_in_hardware():
    emulated = {"hardware": {**CPU["hardware"], "bf16_native": False}, "workload": CPU["workload"]}
    native = {"hardware": {**CPU["hardware"], "bf16_native": True}, "workload": CPU["workload"]}
    # bf16 stays offered either way (whether it is faster is measured); only the advice changes
    assert SPACE.offer(emulated, {}, {}).choices["amp"] == ["off", "bf16"]
    assert SPACE.advice_params(SPACE.offer(emulated, {}, {}), emulated, {})["amp"] == "off"
    assert SPACE.advice_params(SPACE.offer(native, {}, {}), native, {})["amp"] == "bf16"


def test_cpu_bf16_in_hardware_is_read_from_the_cpus_flags():
    from knobtune.trainers.common.hostinfo import cpu_bf16_native

    epyc_avx2 = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma\n"
    sapphire_rapids = "processor\t: 0\nflags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
    graviton3 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"
    assert not cpu_bf16_native(epyc_avx2) and not cpu_bf16_native("")
    assert cpu_bf16_native(sapphire_rapids) and cpu_bf16_native(graviton3)


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


def test_more_parallel_interleave_calls_than_a_fixed_cycle_is_invalid():
    # tf.data refuses it when the pipeline is built (InvalidArgumentError): a trial of it is
    # invalid without a child, so the sampler learns the clash instead of a crash
    tf_space = for_framework("tensorflow")
    why = tf_space.invalid({"cycle_length": 1, "interleave_parallel_calls": 2}, CPU)
    assert why and "interleave_parallel_calls=2 with cycle_length=1" in why
    for calls, cycle in [(2, 2), (1, 4), ("autotune", 1), (2, "autotune"), (0, 1)]:
        assert tf_space.invalid({"cycle_length": cycle, "interleave_parallel_calls": calls}, CPU) is None


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
                              "compile": ["off"], "intra_op_threads": [0], "optimizer_impl": ["default"]}, {})
    grid = list(SPACE.grid(offer))
    # workers 0: 1 config; workers 1 or 2: 3 prefetch x 2 persistent x 2 in_order each
    assert len(grid) == 1 + 2 * 3 * 2 * 2
    rng = random.Random(0)
    for _ in range(50):
        params = SPACE.random_params(offer, rng)
        assert ("prefetch_factor" in params) == (params["num_workers"] > 0)
        assert ("dataloader_in_order" in params) == (params["num_workers"] > 0)


def test_the_workloads_own_batch_size_is_the_baseline_not_the_knob_default():
    ctx = {**CPU, "workload": {"batch_size": 32, "conv": False}}
    offer = SPACE.offer(ctx, {"batch_size": [16, 32]}, {})
    assert offer.choices["batch_size"] == [16, 32]
    assert SPACE.baseline_params(offer, ctx, {})["batch_size"] == 32


def test_optimizer_impl_offers_what_the_probe_saw_the_optimizer_step_with():
    assert SPACE.offer(CPU, {}, {}).choices["optimizer_impl"] == ["default", "foreach", "fused"]
    rmsprop = {**CPU, "workload": {**CPU["workload"], "optimizer": "RMSprop",
                                   "optimizer_impls": ["default", "foreach"]}}
    offer = SPACE.offer(rmsprop, {"optimizer_impl": ["fused", "foreach"]}, {})
    assert offer.choices["optimizer_impl"] == ["foreach", "default"]  # the baseline's value kept
    assert any("RMSprop has no fused" in note for note in offer.dropped["optimizer_impl"])
    lbfgs = {**CPU, "workload": {**CPU["workload"], "optimizer": "LBFGS", "optimizer_impls": ["default"]}}
    assert "LBFGS has no foreach or fused" in SPACE.offer(lbfgs, {}, {}).unavailable["optimizer_impl"]
    script = {**CPU, "workload": {**CPU["workload"], "optimizer": None, "optimizer_impls": ["default"]}}
    assert "kt.prepare(model, optimizer)" in SPACE.offer(script, {}, {}).unavailable["optimizer_impl"]


def test_dataloader_in_order_needs_torch_2_6_and_workers():
    old_torch = {**CPU, "hardware": {**CPU["hardware"], "loader_in_order": False}}
    assert "torch >= 2.6" in SPACE.offer(old_torch, {}, {}).unavailable["dataloader_in_order"]
    offer = SPACE.offer(CPU, {"num_workers": [0]}, {})
    trial = Recorder()
    values = SPACE.suggest(trial, offer)
    assert "dataloader_in_order" not in trial.asked
    resolved = SPACE.resolve(values, offer, CPU)["dataloader_in_order"]
    assert (resolved.value, resolved.applied) == (True, False) and "num_workers > 0" in resolved.why
    assert SPACE.offer(CUDA, {}, {}).choices["expandable_segments"] == [False, True]


TF_SPACE = for_framework("tensorflow")
TF_CPU = {"hardware": {"gpu": False, "cuda": False, "bf16": True, "usable_cores": 2}, "workload": {"batch_size": 64}}
TF_GPU = {"hardware": {"gpu": True, "cuda": True, "bf16": True, "tf32": True, "usable_cores": 8},
          "workload": {"batch_size": 64}}


def _tf_resolved(ctx, narrowing, baseline=None):
    offer = TF_SPACE.offer(ctx, narrowing, baseline or {})
    trial = Recorder()
    return trial, TF_SPACE.resolve(TF_SPACE.suggest(trial, offer), offer, ctx, baseline)


def test_tensorflow_gpu_thread_mode_is_offered_on_a_gpu_only():
    assert "no GPU" in TF_SPACE.offer(TF_CPU, {}, {}).unavailable["gpu_thread_mode"]
    assert TF_SPACE.offer(TF_GPU, {}, {}).choices["gpu_thread_mode"] == ["global", "gpu_private"]


def test_tensorflow_auto_clustering_is_not_asked_when_jit_compile_compiles_the_whole_step():
    trial, resolved = _tf_resolved(TF_CPU, {"jit_compile": [True]}, {"jit_compile": True})
    assert "xla_auto_clustering" not in trial.asked
    auto = resolved["xla_auto_clustering"]
    assert auto.applied is False and "jit_compile=True" in auto.why
    trial, resolved = _tf_resolved(TF_CPU, {"jit_compile": [False]})
    assert trial.asked["xla_auto_clustering"] == [False, True]


def test_tensorflow_data_options_are_asked_only_where_they_change_something():
    # parallel maps: nothing for map_parallelization to rewrite; the pool serves the parallel maps
    trial, resolved = _tf_resolved(TF_CPU, {"map_parallel_calls": [2]})
    assert "map_parallelization" not in trial.asked and "already runs" in resolved["map_parallelization"].why
    assert trial.asked["private_threadpool_size"] == [0, 1, 2]
    # everything sequential and map_parallelization off: no op runs on a pool
    trial, resolved = _tf_resolved(TF_CPU, {"map_parallel_calls": [0], "interleave_parallel_calls": [0],
                                            "prefetch": [0], "map_parallelization": [False]},
                                   {"map_parallelization": False})
    assert "private_threadpool_size" not in trial.asked
    assert "no thread pool" in resolved["private_threadpool_size"].why
    # sequential maps with map_parallelization (TensorFlow's default) run on the pool
    trial, _ = _tf_resolved(TF_CPU, {"map_parallel_calls": [0], "interleave_parallel_calls": [0], "prefetch": [0],
                                     "map_parallelization": [True]})
    assert "private_threadpool_size" in trial.asked


def test_the_engine_imports_neither_framework_with_the_knobs_definitions():
    code = ("import sys\n"
            "import knobtune.spaces.pytorch, knobtune.spaces.tensorflow, knobtune.search.story, knobtune.search.cli\n"
            "from knobtune.search.story.snippet import snippet\n"
            "for fw in ('pytorch', 'tensorflow'):\n"
            "    snippet({'framework': fw, 'knobs': {'batch_size': 64}})\n"
            "assert 'torch' not in sys.modules and 'tensorflow' not in sys.modules, sorted(sys.modules)\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_no_module_of_the_spaces_imports_a_framework_even_inside_a_function():
    """spaces/ is what the engine reads: an import of torch, TensorFlow or Keras anywhere in it (a
    function's own import included), or of the trainers, would bring a framework to the engine."""
    import ast

    import knobtune.spaces

    for path in Path(knobtune.spaces.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert name.split(".")[0] not in ("torch", "tensorflow", "keras") and not name.startswith(
                    "knobtune.trainers"), f"{path.name}:{node.lineno} imports {name}"


@pytest.mark.parametrize("framework", ["pytorch", "tensorflow"])
def test_every_knob_says_how_it_is_applied_and_read_back(framework):
    """Each knob of the space has its child side (trainers/<framework>/knobs.py: HANDLERS): read back,
    and, when it applies itself ("load"), an environ or an apply."""
    code = (f"from knobtune.trainers.{framework}.knobs import HANDLERS\n"
            "from knobtune.trainers.common.handling import Handling\n"
            "handled = dict(HANDLERS.handling)\n"
            "unread = Handling().read\n"
            "for knob in HANDLERS.space.knobs:\n"
            "    h = handled.get(knob.name)\n"
            "    assert h is not None and h.read is not unread, f'{knob.name} is never read back'\n"
            "    if knob.applied_by == 'load':\n"
            "        assert h.apply or h.environ, f'{knob.name} is applied by nothing'\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_child_checks_each_value_by_its_knobs_definition():
    """Space.problems (a trial's child, production's Tuned.load): a value the knob does not take,
    or one this process's device lacks, says which knob and why; the others pass."""
    from knobtune.spaces.tensorflow import SPACE as TF

    cpu = {"cuda": False, "bf16": True, "loader_in_order": True}
    found = SPACE.problems({"amp": "fp16", "compile": "reduce-overhead", "pin_memory": True, "num_workers": 2,
                            "matmul_precision": "lowest", "expandable_segments": False}, cpu)
    assert set(found) == {"amp", "compile", "pin_memory", "matmul_precision"}
    assert "needs CUDA; this process has no CUDA device" in found["amp"]
    assert found["matmul_precision"].startswith("matmul_precision='lowest': expected one of")
    gpu = {"cuda": True, "bf16": True, "loader_in_order": True}
    graphs = SPACE.problems({"compile": "max-autotune", "accumulation_steps": 2}, gpu)
    assert "accumulation_steps=2 needs compile 'off' or 'default'" in graphs["compile"]
    assert SPACE.problems({"compile": "max-autotune", "accumulation_steps": 1, "amp": "bf16"}, gpu) == {}
    tf = TF.problems({"mixed_precision": "mixed_float16", "gpu_thread_mode": "gpu_private",
                      "steps_per_execution": 0, "loop": "fit"}, {"gpu": False, "bf16": True})
    assert set(tf) == {"mixed_precision", "gpu_thread_mode", "steps_per_execution"}
