"""The trainer libraries people already use, tuned through their own arguments: Hugging Face's
``Trainer`` (studies/hf_causal_lm.py) and Lightning (studies/lightning_digits.py), each tuned
through the CLI in real children, exported, and run in production with the export."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import FAST, ROOT, TINY_BURST, exported_and_run, knobtune, printed_json, stored, study_file

pytest.importorskip("transformers")

HF_SCRIPT = ROOT / "studies" / "hf_causal_lm.py"


def library_study(directory: Path, name: str, script: Path, args: list[str], space: str) -> Path:
    """A 3-trial study of an example script on tiny bursts, over ``space`` (its [space] lines, and
    any section after them)."""
    return study_file(directory, f"""
[study]
name = "{name}"
framework = "pytorch"
script = "{script}"
args = {json.dumps(args)}
trials = 3
prune_below = 0
{TINY_BURST}
[space]
{space.strip()}
""")


@pytest.mark.long
def test_hf_trainer_example_is_tuned_exported_and_run_in_production(tmp_path: Path):
    path = library_study(tmp_path, "hf-example", HF_SCRIPT, ["--epochs", "1"], """
batch_size = [16, 32]
num_workers = [0, 1]
amp = ["off", "bf16"]
compile = ["off"]
optimizer_impl = ["default", "fused"]
group_by_length = [false, true]
[baseline]
group_by_length = true   # (the script's samples differ in length: the knob is offered, and read back)
""")
    knobtune("run", str(path), *FAST, cwd=tmp_path, check=0)
    trials = stored(tmp_path, "hf-example").trials
    assert [t.user_attrs["outcome"] for t in trials] == ["ok"] * 3
    for trial in trials:
        applied, knobs = trial.user_attrs["applied"], trial.user_attrs["knobs"]
        assert applied["integration"] == "transformers.Trainer"
        # read back from what the Trainer built, equal to what the trial asked for
        for name in ("batch_size", "num_workers", "amp", "optimizer_impl", "group_by_length"):
            assert knobs[name]["applied"] and knobs[name]["value"] == trial.params.get(name, knobs[name]["value"])
        assert applied["trainer_nan_filter"] is False and applied["trainer_max_steps"] > 0
        assert applied["reported_metrics"]["guard_metric"] == "exp(-eval_loss)"
        assert 0 < trial.user_attrs["val_accuracy"] < 1
        assert trial.user_attrs["loader"]["drop_last"] is True
    base = trials[0].user_attrs["knobs"]
    # the baseline is the script's own TrainingArguments: --batch-size 16, the Trainer's fused AdamW
    assert base["batch_size"]["value"] == 16 and base["optimizer_impl"]["value"] == "fused"
    assert base["group_by_length"] == {"value": True, "applied": True}  # the Trainer's LengthGroupedSampler
    assert trials[0].user_attrs["applied"]["autocast_dtype"] is None

    best, snippet, proc = exported_and_run(tmp_path, "hf-example", HF_SCRIPT, "--epochs", "0.3")
    assert best["integration"] == "transformers.Trainer"
    assert f"per_device_train_batch_size={best['knobs']['batch_size']}," in snippet.stdout
    assert proc.returncode == 0, proc.stderr
    stats = printed_json(proc, "knobtune stats: ")
    for knob in ("batch_size", "num_workers", "amp", "optimizer_impl", "accumulation_steps", "group_by_length"):
        assert stats["knobs"][knob] == best["knobs"][knob], knob
    assert stats["samples"] > 0 and stats["intervals"] >= 1


REFUSED = '''
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from knobtune.pytorch import Tuned
kt = Tuned.load()
args = kt.training_arguments(TrainingArguments(output_dir="out", report_to="none", {fields}))
'''


@pytest.mark.parametrize("fields, reason", [
    ("fp16=True, bf16=True, use_cpu=True", "At most one of fp16 and bf16"),
    ("dataloader_prefetch_factor=4", "--dataloader_prefetch_factor can only be set when"),
])
def test_a_trainer_script_with_a_bad_combination_is_refused_before_any_trial(tmp_path: Path, fields: str,
                                                                               reason: str):
    script = tmp_path / "train.py"
    script.write_text(REFUSED.format(fields=fields))
    path = study_file(tmp_path, f"""
[study]
name = "refused"
framework = "pytorch"
script = "{script}"
trials = 2
{TINY_BURST}
""")
    proc = knobtune("run", str(path), *FAST, cwd=tmp_path, check=2)
    assert reason in proc.stderr
    assert not (tmp_path / "knobtune-artifacts").exists() or not any((tmp_path / "knobtune-artifacts").iterdir())


LIGHTNING_SCRIPT = ROOT / "studies" / "lightning_digits.py"


@pytest.mark.long
def test_lightning_example_is_tuned_exported_and_run_in_production(tmp_path: Path):
    pytest.importorskip("lightning")
    path = library_study(tmp_path, "lightning-example", LIGHTNING_SCRIPT, ["--epochs", "2"], """
batch_size = [32, 64]
accumulation_steps = [1, 2]
amp = ["off", "bf16"]
compile = ["off"]
optimizer_impl = ["default", "foreach"]
""")
    knobtune("run", str(path), *FAST, cwd=tmp_path, check=0)
    trials = stored(tmp_path, "lightning-example").trials
    assert [t.user_attrs["outcome"] for t in trials] == ["ok"] * 3
    for trial in trials:
        applied, knobs = trial.user_attrs["applied"], trial.user_attrs["knobs"]
        assert applied["integration"] == "lightning.Trainer"
        for name in ("batch_size", "accumulation_steps", "amp", "optimizer_impl"):
            assert knobs[name]["applied"] and knobs[name]["value"] == trial.params.get(name, knobs[name]["value"])
        # what Lightning ran with, read from the Trainer and the module's first forward
        assert applied["precision"] == {"off": "32-true", "bf16": "bf16-mixed"}[knobs["amp"]["value"]]
        assert applied["autocast_dtype"] == {"off": None, "bf16": "bfloat16"}[knobs["amp"]["value"]]
        assert applied["optimizer_impl"] == knobs["optimizer_impl"]["value"]
        assert trial.user_attrs["loader"]["drop_last"] is True  # kt.dataloader's, inside the DataModule
        assert applied["reported_metrics"]["guard_metric"] == "val_accuracy"
        assert 0.1 < trial.user_attrs["val_accuracy"] <= 1
    assert trials[0].user_attrs["knobs"]["batch_size"]["value"] == 64  # the script's own --batch-size

    best, snippet, proc = exported_and_run(tmp_path, "lightning-example", LIGHTNING_SCRIPT, "--epochs", "2")
    assert best["integration"] == "lightning.Trainer"
    assert "trainer = L.Trainer(" in snippet.stdout and f"batch_size={best['knobs']['batch_size']}" in snippet.stdout
    assert proc.returncode == 0, proc.stderr
    assert "val_accuracy" in proc.stdout
    stats = printed_json(proc, "knobtune stats: ")
    for knob in ("batch_size", "accumulation_steps", "amp", "optimizer_impl", "num_workers"):
        assert stats["knobs"][knob] == best["knobs"][knob], knob
    assert stats["samples"] > 0
