"""The TensorFlow integration API (trainers/tensorflow/tuned.py) through a real Keras script in real
child processes (this process never imports tensorflow): the script tuned as a study, its winner
exported and run in production, and the bad inputs a user can give it."""
from __future__ import annotations

import json
import subprocess
import sys
from functools import partial
from pathlib import Path

import optuna
import pytest

import conftest
from conftest import FAST, WORKLOADS, at_once, knobtune, printed_json, script_study, stored

pytestmark = pytest.mark.tensorflow
SCRIPT = WORKLOADS / "kt_tf_script.py"

STUDY = """
[study]
name = "own-tf"
framework = "tensorflow"
script = "{script}"
args = {args}
trials = {trials}
seed = 1
prune_below = 0   # these tests are not about pruning; on a busy machine tiny bursts are pruned at random
{burst}
[space]
batch_size = [16, 32]
accumulation_steps = [1]
jit_compile = [false]
steps_per_execution = [1, 4]
"""


def own_study(tmp_path: Path, args: list[str] | None = None, trials: int = 3) -> Path:
    return script_study(tmp_path, STUDY, SCRIPT, args, trials)


def load(tmp_path: Path) -> optuna.Study:
    return stored(tmp_path, "own-tf")


run_script = partial(conftest.run_script, SCRIPT)  # the script in production, as a user runs it
stats = partial(printed_json, prefix="stats ")


def test_own_keras_script_tuned_exported_and_run_in_production(tmp_path: Path):
    proc = knobtune("run", str(own_study(tmp_path, ["--epochs", "3"])), *FAST, cwd=tmp_path, check=0)
    assert "script kt_tf_script.py --epochs 3" in proc.stderr
    assert "loop is not searched: the script trains through kt.fit" in proc.stderr
    study = load(tmp_path)
    done = [t for t in study.trials if t.user_attrs.get("outcome") == "ok"]
    assert len(done) == 3, [(t.params, t.user_attrs.get("failure")) for t in study.trials]
    for t in done:
        a = t.user_attrs
        assert a["samples_per_second"] > 0 and 0 <= a["val_accuracy"] <= 1
        assert a["trained_samples"] == 640  # the burst ran over the repeated pipeline to train_samples
        assert a["knobs"]["batch_size"]["value"] == a["effective_batch_size"] in (16, 32)
        assert a["knobs"]["prefetch"]["applied"] is True and a["knobs"]["loop"]["applied"] is False
        assert a["applied"]["steps_per_execution"] == a["knobs"]["steps_per_execution"]["value"]
    base, advice = study.trials[0], study.trials[1]
    assert base.user_attrs["is_baseline"] and base.user_attrs["knobs"]["batch_size"]["value"] == 32  # the script's
    assert advice.user_attrs["source"] == "advice" and advice.user_attrs["knobs"]["prefetch"]["value"] == "autotune"
    assert [e["op"] for e in advice.user_attrs["pipeline"]][0] == "PrefetchDataset"  # applied, and last
    # export, then run the script in production with it
    knobtune("export", "own-tf", "-o", "best.json", cwd=tmp_path, check=0)
    best = json.loads((tmp_path / "best.json").read_text())
    prod = run_script("--epochs", "5", config=tmp_path / "best.json", cwd=tmp_path,
                      extra_env={"KNOBTUNE_WATCHDOG_S": "0.05"})
    assert prod.returncode == 0, prod.stderr
    assert "loaded " in prod.stderr and "best.json" in prod.stderr and "Traceback" not in prod.stderr
    assert prod.stdout.count("done") == 5  # production runs every epoch
    live = stats(prod)
    knobs = best["knobs"]
    for name in ("batch_size", "prefetch", "map_parallel_calls", "cycle_length", "steps_per_execution",
                 "mixed_precision"):
        assert live["knobs"][name] == knobs[name], name
    assert live["samples"] >= 5 * 320  # every epoch counted (a short last execution may count whole)
    assert live["intervals"] >= 2 and live["samples_per_second"] > 0
    assert live["expected_samples_per_second"] == pytest.approx(
        (best.get("confirmed") or {}).get("median") or best["metrics"]["samples_per_second"])
    assert "watchdog: " in prod.stderr  # the first judged interval's rate is logged


def test_exports_refused_fallen_back_or_absent(tmp_path: Path):
    # another framework's export: refused
    (tmp_path / "torch.json").write_text(json.dumps({"format": "knobtune.best/1", "framework": "pytorch",
                                                    "knobs": {}}))
    # another machine: a warning; a knob this one cannot apply falls back, or is an error with strict=True
    export = {"format": "knobtune.best/1", "framework": "tensorflow", "study": "x", "trial": 3,
              "knobs": {"batch_size": 16, "mixed_precision": "mixed_float16", "prefetch": 2, "loop": "fit"},
              "metrics": {"samples_per_second": 1000.0},
              "fingerprint": {"gpus": [{"name": "NVIDIA H200"}], "usable_cores": 64, "tensorflow": "2.0.0",
                              "cuda_version": "12.1"}}
    (tmp_path / "gpu.json").write_text(json.dumps(export))
    # (four independent scripts, each mostly importing TensorFlow: at once)
    refused, proc, strict, own = at_once(
        lambda: run_script(config=tmp_path / "torch.json", cwd=tmp_path),
        lambda: run_script("--epochs", "1", config=tmp_path / "gpu.json", cwd=tmp_path),
        lambda: subprocess.run([sys.executable, "-c", "from knobtune.tensorflow import Tuned; "
                                f"Tuned.load({str(tmp_path / 'gpu.json')!r}, strict=True)"],
                               cwd=tmp_path, capture_output=True, text=True, timeout=120),
        lambda: run_script("--epochs", "1", "--batch-size", "20", cwd=tmp_path))
    assert refused.returncode != 0
    assert "an export of a pytorch study, expected one of a tensorflow study" in refused.stderr
    assert proc.returncode == 0, proc.stderr
    assert "measured on a different machine" in proc.stderr and "GPUs NVIDIA H200 -> none" in proc.stderr
    assert "tensorflow 2.0.0 ->" in proc.stderr
    assert "mixed_float16' (with loss scaling) needs a GPU" in proc.stderr
    assert "running with mixed_precision='float32' instead" in proc.stderr
    live = stats(proc)
    assert live["knobs"]["mixed_precision"] == "float32" and live["knobs"]["batch_size"] == 16
    assert live["knobs"]["prefetch"] == 2
    assert strict.returncode != 0 and "strict=True refuses to fall back" in strict.stderr
    # no export: the script's own settings
    assert own.returncode == 0, own.stderr
    assert "running with the script's own settings" in own.stderr
    assert stats(own)["knobs"]["batch_size"] == 20


@pytest.mark.parametrize("flag, expected", [
    ("--raise-before", "the user's data set could not be opened"),
    ("--no-fit", "the script never started batches: does it call kt.fit(model, dataset)?"),
])
def test_script_failing_before_its_first_fit_is_exit_2(tmp_path: Path, flag: str, expected: str):
    proc = knobtune("run", str(own_study(tmp_path, [flag])), cwd=tmp_path, check=2)
    assert expected in proc.stderr
    assert not (tmp_path / "knobtune.db").exists() or not optuna.get_all_study_summaries(
        f"sqlite:///{tmp_path / 'knobtune.db'}")


def test_knobs_the_script_never_exercises_are_not_applied_nor_searched(tmp_path: Path):
    proc = knobtune("run", str(own_study(tmp_path, ["--no-compile"], trials=2)), *FAST, cwd=tmp_path, check=0)
    why = "the script never calls kt.compile(model, ...)"
    assert f"steps_per_execution is not searched: {why}" in proc.stderr
    study = load(tmp_path)
    for t in study.trials:
        if t.user_attrs.get("outcome") == "ok":
            knobs = t.user_attrs["knobs"]
            assert knobs["steps_per_execution"]["applied"] is False and knobs["steps_per_execution"]["why"] == why
            assert knobs["jit_compile"]["applied"] is False and knobs["prefetch"]["applied"] is True
    assert all("steps_per_execution" not in t.params for t in study.trials[1:])
