"""The knobs as trainer libraries' arguments (spaces/libraries.py), defined once for the trial's
child, production and the export snippet: the mapping both ways, what it refuses, and the
snippets a user pastes. Framework-free: nothing is imported from torch, transformers or lightning."""
from __future__ import annotations

import pytest

from knobtune.search.story.snippet import snippet
from knobtune.spaces import for_framework, libraries

SPACE = for_framework("pytorch")
DEFAULTS = {knob.name: knob.default for knob in SPACE.knobs}


def test_hf_fields_follow_the_knobs_and_leave_the_worker_options_out_without_workers():
    values = {**DEFAULTS, "batch_size": 32, "accumulation_steps": 2, "num_workers": 0, "prefetch_factor": 4,
              "amp": "bf16", "compile": "max-autotune", "optimizer_impl": "fused"}
    fields, skipped = libraries.hf_fields(values, set(values), cuda=False, optim="adamw_torch")
    assert fields["per_device_train_batch_size"] == 32 and fields["gradient_accumulation_steps"] == 2
    assert fields["dataloader_num_workers"] == 0 and fields["dataloader_prefetch_factor"] is None
    assert fields["dataloader_persistent_workers"] is False
    assert fields["bf16"] is True and fields["fp16"] is False and fields["use_cpu"] is True
    assert fields["torch_compile"] is True and fields["torch_compile_mode"] == "max-autotune"
    assert fields["optim"] == "adamw_torch_fused" and skipped == {}
    assert "tf32" not in fields and "dataloader_pin_memory" not in fields  # CUDA-only fields, on a CPU

    on_gpu, _ = libraries.hf_fields({**values, "num_workers": 4, "matmul_precision": "high", "pin_memory": True,
                                     "amp": "fp16"}, set(values) | {"pin_memory"}, cuda=True, optim="adamw_torch")
    assert on_gpu["dataloader_prefetch_factor"] == 4 and on_gpu["tf32"] is True
    assert on_gpu["dataloader_pin_memory"] is True and on_gpu["fp16"] is True and "use_cpu" not in on_gpu


def test_hf_fields_set_only_the_knobs_named_and_say_why_an_optimizer_is_left_alone():
    fields, skipped = libraries.hf_fields({**DEFAULTS, "optimizer_impl": "fused"}, {"optimizer_impl"}, cuda=False,
                                          optim="adafactor")
    assert fields == {}
    assert "TrainingArguments.optim is 'adafactor'" in skipped["optimizer_impl"]
    with pytest.raises(ValueError, match="optimizer_impl='foreach'"):
        libraries.hf_fields({**DEFAULTS, "optimizer_impl": "foreach"}, {"optimizer_impl"}, cuda=False,
                            optim="adamw_torch")


def test_hf_settings_read_a_scripts_own_arguments_as_the_baseline():
    own = {"per_device_train_batch_size": 16, "gradient_accumulation_steps": 4, "dataloader_num_workers": 2,
           "dataloader_prefetch_factor": None, "dataloader_persistent_workers": True, "bf16": True, "fp16": False,
           "torch_compile": True, "torch_compile_mode": None, "optim": "adamw_torch_fused",
           "dataloader_pin_memory": True, "tf32": None}
    cpu = libraries.hf_settings(own, cuda=False)
    assert cpu == {"batch_size": 16, "accumulation_steps": 4, "num_workers": 2, "amp": "bf16", "compile": "default",
                   "optimizer_impl": "fused", "group_by_length": False, "prefetch_factor": 2,
                   "persistent_workers": True, "dataloader_in_order": True}
    assert libraries.hf_settings(own, cuda=True)["pin_memory"] is True
    grouped = {**own, "train_sampling_strategy": "group_by_length"}
    assert libraries.hf_settings(grouped, cuda=False)["group_by_length"] is True
    on, _ = libraries.hf_fields({**DEFAULTS, "group_by_length": True}, {"group_by_length"}, cuda=False,
                                optim="adamw_torch")
    off, _ = libraries.hf_fields({**DEFAULTS, "group_by_length": False}, {"group_by_length"}, cuda=False,
                                 optim="adamw_torch", sampling="group_by_length")
    kept, _ = libraries.hf_fields({**DEFAULTS, "group_by_length": False}, {"group_by_length"}, cuda=False,
                                  optim="adamw_torch", sampling="sequential")
    assert on == {"train_sampling_strategy": "group_by_length"} and off == {"train_sampling_strategy": "random"}
    assert kept == {}  # the script's own sequential order stays


def test_lightning_arguments_both_ways():
    values = {**DEFAULTS, "amp": "fp16", "accumulation_steps": 3, "cudnn_benchmark": True}
    assert libraries.lightning_arguments(values, set(values), cuda=False) == {"precision": "16-mixed",
                                                                            "accumulate_grad_batches": 3}
    assert libraries.lightning_arguments(values, set(values), cuda=True)["benchmark"] is True
    assert libraries.lightning_settings({"precision": "bf16-mixed", "accumulate_grad_batches": 2}, cuda=False) == {
        "accumulation_steps": 2, "amp": "bf16"}
    assert libraries.lightning_settings({}, cuda=False) == {"accumulation_steps": 1, "amp": "off"}


def _export(integration: str | None, **knobs: object) -> dict:
    return {"format": "knobtune.best/1", "study": "s", "framework": "pytorch", "trial": 3,
            "integration": integration, "knobs": {**DEFAULTS, **knobs}, "not_applied": {"pin_memory": "needs CUDA"},
            "fingerprint": {"cuda_available": False}, "speedup": {"value": 1.4, "figure": "median of 3 paired rounds"}}


def test_the_snippet_of_a_trainer_script_is_its_arguments():
    text = snippet(_export(libraries.HF, batch_size=32, num_workers=2, prefetch_factor=4, amp="bf16",
                           optimizer_impl="fused", pin_memory=True))
    assert "1.40x the baseline (median of 3 paired rounds)" in text
    assert "args = TrainingArguments(" in text
    for line in ("per_device_train_batch_size=32,", "dataloader_num_workers=2,", "dataloader_prefetch_factor=4,",
                 "bf16=True,", "use_cpu=True,", "optim='adamw_torch_fused',", "logging_nan_inf_filter=False,"):
        assert line in text, line
    assert "dataloader_pin_memory" not in text  # not applied when measured: left out
    compile(text.replace("...,", "None,"), "snippet", "exec")  # it is Python

    lit = snippet(_export(libraries.LIGHTNING, batch_size=128, accumulation_steps=2, amp="bf16", compile="default"))
    for line in ("batch_size=128", "precision='bf16-mixed',", "accumulate_grad_batches=2,",
                 "model = torch.compile(model)", "trainer = L.Trainer("):
        assert line in lit, line
    compile(lit.replace("...,", "None,"), "snippet", "exec")
    # an export without an integration (an own loop) keeps the plain script
    assert "for epoch in range(epochs):" in snippet(_export(None, batch_size=32))


@pytest.mark.parametrize("module, extra", [("transformers", "transformers"), ("lightning.pytorch", "lightning")])
def test_a_script_importing_a_missing_trainer_library_says_which_extra_to_install(tmp_path, module, extra):
    from knobtune.trainers.common import script
    from knobtune.trainers.common.errors import WorkloadError

    path = tmp_path / "train.py"  # (raised as a missing module is: this process has both installed)
    path.write_text(f"raise ModuleNotFoundError('No module named ' + {module!r}, name={module!r})\n")
    with pytest.raises(WorkloadError, match=rf"imports '{module}'.*pip install 'knobtune\[{extra}\]'"):
        script.run(str(path), [])
    other = tmp_path / "other.py"  # any other missing module is the script's own error, as it was
    other.write_text("import no_such_module_here\n")
    with pytest.raises(ModuleNotFoundError):
        script.run(str(other), [])
