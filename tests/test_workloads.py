"""The charlm and digits-resnet built-ins: a fixed corpus with held-out files, the same model in
both frameworks, models that learn, knobs that reach what they are for, options checked."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from knobtune.search.launch.runner import run_child
from knobtune.spaces import for_framework
from knobtune.trainers.common import text
from knobtune.trainers.common.errors import WorkloadError
from knobtune.trainers.common.wire import Burst, Request

CTX = {"hardware": {"cuda": False, "gpu": False, "bf16": True, "usable_cores": 2}, "workload": {"batch_size": 32}}
LEARN_BURST = Burst(train_samples=3000, warmup_samples=600, windows=3)
SHORT_BURST = Burst(train_samples=256, warmup_samples=64, windows=2)


def child(framework: str, command: str, workload: str, burst: Burst | None = None,
          options: dict[str, Any] | None = None, **knobs: Any):
    request = Request(workload=workload, workload_options=options or {})
    if command == "burst":
        request = replace(request, knobs={**for_framework(framework).defaults(CTX), **knobs}, burst=burst or SHORT_BURST)
    return run_child(framework, command, request, 300)


def test_charlm_corpus_holds_out_whole_files_and_is_written_once():
    corpus = text.prepare(32, 20_000, 16)
    assert not set(corpus.train_files) & set(corpus.val_files) and len(corpus.val_files) >= 1
    assert corpus.train.shape[1] == corpus.val.shape[1] == 33 and len(corpus.val) == 16
    assert corpus.train.size <= 20_000 and corpus.train.max() < text.VOCAB and corpus.val.max() < text.VOCAB
    again = text.prepare(32, 20_000, 16)
    assert again.root == corpus.root and np.array_equal(again.train, corpus.train)
    assert text.prepare(16, 20_000, 16).root != corpus.root  # another context, other windows


def test_charlm_corpus_from_a_directory(tmp_path: Path):
    for i in range(10):
        (tmp_path / f"m{i}.py").write_bytes(("x = 1\n" * 400).encode() + "# héllo\n".encode())
    train, val = text.source_files(tmp_path)
    assert [p.name for p in val] == ["m5.py"] and len(train) == 9
    tokens = text.encode("a é\n".encode())
    assert tokens.tolist() == [ord("a"), ord(" "), 0, 0, ord("\n")]  # é is two bytes, both token 0
    (tmp_path / "m0.py").unlink()
    with pytest.raises(WorkloadError, match="9 \\*.py files, expected at least 10"):
        text.source_files(tmp_path)
    with pytest.raises(WorkloadError, match="train_chars = 10: expected an integer >= 1000"):
        text.prepare(32, 10, 16, tmp_path)


@pytest.mark.tensorflow
@pytest.mark.parametrize("workload", ["charlm", "digits-resnet"])
def test_same_model_and_data_in_both_frameworks(workload: str):
    described = {}
    for framework in ("pytorch", "tensorflow"):
        probe = child(framework, "probe", workload)
        assert probe.outcome == "ok", probe.failure
        described[framework] = probe.result.workload
    torch_side, tf_side = described["pytorch"], described["tensorflow"]
    assert torch_side["parameters"] == tf_side["parameters"] > 0
    assert torch_side["train_samples"] == tf_side["train_samples"]
    assert torch_side["eval_samples"] == tf_side["eval_samples"]
    assert torch_side["conv"] is (workload == "digits-resnet")


@pytest.mark.parametrize("framework", ["pytorch", pytest.param("tensorflow", marks=pytest.mark.tensorflow)])
def test_charlm_learns_more_than_the_commonest_character(framework: str):
    """A model that learned nothing from context scores at most the share of the commonest
    character (the space, from indentation); a few thousand windows beat it."""
    corpus = text.prepare(64, 1_000_000, 256)
    targets = corpus.val[:, 1:].ravel()
    commonest = np.bincount(targets).max() / targets.size
    burst = child(framework, "burst", "charlm", LEARN_BURST)
    assert burst.outcome == "ok", burst.failure
    assert burst.result.val_accuracy > commonest + 0.02, (burst.result.val_accuracy, commonest)


def test_channels_last_reaches_the_resnet_convolutions_and_is_not_offered_for_charlm():
    burst = child("pytorch", "burst", "digits-resnet", channels_last=True)
    assert burst.outcome == "ok", burst.failure
    assert burst.result.knobs_effective["channels_last"] is True  # read from the conv weights
    probe = child("pytorch", "probe", "charlm")
    assert probe.outcome == "ok", probe.failure
    ctx = {"hardware": probe.result.fingerprint["hardware"], "workload": probe.result.workload}
    offer = for_framework("pytorch").offer(ctx, {}, {})
    assert offer.unavailable["channels_last"] == "the model has no convolutions"


@pytest.mark.parametrize("options, expected", [
    ({"width": 64, "heads": 3}, "width = 64, heads = 3: expected a width divisible by heads"),
    ({"depth": 0}, "charlm option depth = 0: expected an integer >= 1"),
])
def test_charlm_options_are_checked(options: dict[str, Any], expected: str):
    burst = child("pytorch", "burst", "charlm", options=options)
    assert burst.outcome == "error" and expected in (burst.failure or ""), (burst.outcome, burst.failure)


def test_digits_resnet_options_are_checked():
    burst = child("pytorch", "burst", "digits-resnet", options={"blocks": 0})
    assert burst.outcome == "error" and "digits-resnet option blocks = 0: expected an integer >= 1" in burst.failure
