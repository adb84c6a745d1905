"""The integration API (trainers/pytorch/tuned.py) through real scripts in real child processes:
a user's own script tuned as a study, its winner exported and run in production, and every bad
input a user can give it."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path

import optuna
import pytest

from knobtune.trainers.common.wire import Burst, Request

import conftest
from conftest import FAST, WORKLOADS, at_once, knobtune, printed_json, script_study, stored

SCRIPT = WORKLOADS / "kt_script.py"

STUDY = """
[study]
name = "own"
framework = "pytorch"
script = "{script}"
args = {args}
trials = {trials}
seed = 1
prune_below = 0   # these tests are not about pruning; on a busy machine tiny bursts are pruned at random
{burst}
[space]
batch_size = [16, 32]
accumulation_steps = [1]
compile = ["off"]
amp = ["off", "bf16"]
intra_op_threads = [0, 1]
"""


def own_study(tmp_path: Path, args: list[str] | None = None, trials: int = 3, script: Path = SCRIPT) -> Path:
    return script_study(tmp_path, STUDY, script, args, trials)


def load(tmp_path: Path) -> optuna.Study:
    return stored(tmp_path, "own")


run_script = partial(conftest.run_script, SCRIPT)  # the script in production, as a user runs it
stats = partial(printed_json, prefix="stats ")


def test_own_script_tuned_exported_and_run_in_production(tmp_path: Path):
    proc = knobtune("run", str(own_study(tmp_path, ["--epochs", "3"])), *FAST, cwd=tmp_path, check=0)
    assert "script kt_script.py --epochs 3" in proc.stderr
    study = load(tmp_path)
    done = [t for t in study.trials if t.user_attrs.get("outcome") == "ok"]
    assert len(done) == 3
    for t in done:
        a = t.user_attrs
        assert a["samples_per_second"] > 0 and 0 <= a["val_accuracy"] <= 1
        assert a["trained_samples"] == 640  # the burst ran across the script's epochs to train_samples
        assert a["knobs"]["batch_size"]["value"] == a["loader"]["batch_size"]
        assert a["knobs"]["amp"]["applied"] is True
    base = study.trials[0]
    assert base.user_attrs["is_baseline"] and base.params.get("batch_size", 32) == 32  # the script's own
    # export, then run the script in production with it
    knobtune("export", "own", "-o", "best.json", cwd=tmp_path, check=0)
    best = json.loads((tmp_path / "best.json").read_text())
    prod = run_script("--epochs", "4", config=tmp_path / "best.json", cwd=tmp_path,
                      extra_env={"KNOBTUNE_WATCHDOG_S": "0.05"})
    assert prod.returncode == 0, prod.stderr
    assert "loaded " in prod.stderr and "best.json" in prod.stderr and "Traceback" not in prod.stderr
    assert prod.stdout.count("done") == 4  # production runs every epoch
    live = stats(prod)
    knobs = best["knobs"]
    assert live["knobs"]["batch_size"] == knobs["batch_size"]
    assert live["knobs"]["amp"] == knobs["amp"]
    assert live["knobs"]["num_workers"] == knobs["num_workers"]
    assert live["intervals"] >= 2 and live["samples_per_second"] > 0
    assert live["expected_samples_per_second"] == pytest.approx(
        (best.get("confirmed") or {}).get("median") or best["metrics"]["samples_per_second"])
    assert "watchdog: " in prod.stderr  # the first judged interval's rate is logged
    # for a script that does not adopt the API: the lines to change (executed in test_snippet.py)
    code = knobtune("export", "own", "--format", "snippet", cwd=tmp_path, check=0).stdout
    assert f"DataLoader(train_set, batch_size={knobs['batch_size']}, shuffle=True" in code
    compile(code, "snippet.py", "exec")


def test_script_without_config_runs_with_its_own_settings(tmp_path: Path):
    prod = run_script("--epochs", "1", "--batch-size", "20", cwd=tmp_path)
    assert prod.returncode == 0, prod.stderr
    assert "running with the script's own settings" in prod.stderr
    assert stats(prod)["knobs"]["batch_size"] == 20


def test_export_of_another_format_or_framework_is_refused(tmp_path: Path):
    (tmp_path / "other.json").write_text(json.dumps({"format": "something/2", "framework": "pytorch", "knobs": {}}))
    (tmp_path / "tf.json").write_text(json.dumps({"format": "knobtune.best/1", "framework": "tensorflow",
                                                 "knobs": {}}))
    other, tf, missing = at_once(*(partial(run_script, config=tmp_path / name, cwd=tmp_path)
                                   for name in ("other.json", "tf.json", "missing.json")))
    assert other.returncode != 0 and "format 'something/2', expected 'knobtune.best/1'" in other.stderr
    assert tf.returncode != 0 and "an export of a tensorflow study, expected one of a pytorch study" in tf.stderr
    assert missing.returncode != 0 and "no such file" in missing.stderr


def test_another_machine_warns_and_unusable_knobs_fall_back(tmp_path: Path):
    export = {"format": "knobtune.best/1", "framework": "pytorch", "study": "x", "trial": 3,
              "knobs": {"batch_size": 16, "amp": "fp16", "num_workers": 0},
              "metrics": {"samples_per_second": 1000.0},
              "fingerprint": {"gpus": [{"name": "NVIDIA H200"}], "usable_cores": 64, "torch": "2.0.0",
                              "cuda_version": "12.1"}}
    (tmp_path / "gpu.json").write_text(json.dumps(export))
    proc = run_script("--epochs", "1", config=tmp_path / "gpu.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "measured on a different machine" in proc.stderr and "GPUs NVIDIA H200 -> none" in proc.stderr
    assert "usable cores 64 ->" in proc.stderr
    assert "amp='fp16' (with GradScaler) needs CUDA" in proc.stderr and "running with amp='off' instead" in proc.stderr
    live = stats(proc)
    assert live["knobs"]["amp"] == "off" and live["knobs"]["batch_size"] == 16
    # strict: the fall-back is an error
    strict = subprocess.run([sys.executable, "-c", "from knobtune.pytorch import Tuned; "
                             f"Tuned.load({str(tmp_path / 'gpu.json')!r}, strict=True)"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert strict.returncode != 0 and "strict=True refuses to fall back" in strict.stderr


def test_script_not_found_is_exit_2(tmp_path: Path):
    proc = knobtune("run", str(own_study(tmp_path, script=tmp_path / "nope.py")), cwd=tmp_path, check=2)
    assert "script" in proc.stderr and "no such file" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("flag, expected", [
    ("--raise-before", "the user's data set could not be opened"),
    ("--no-batches", "the script never started batches: does it iterate kt.batches(...)?"),
])
def test_script_failing_before_its_first_batch_is_exit_2(tmp_path: Path, flag: str, expected: str):
    proc = knobtune("run", str(own_study(tmp_path, [flag])), cwd=tmp_path, check=2)
    assert expected in proc.stderr
    assert not (tmp_path / "knobtune.db").exists() or not optuna.get_all_study_summaries(
        f"sqlite:///{tmp_path / 'knobtune.db'}")


def test_script_that_never_reports_is_invalid_and_stops_at_the_baseline(tmp_path: Path):
    proc = knobtune("run", str(own_study(tmp_path, ["--no-report"])), *FAST, cwd=tmp_path, check=1)
    base = load(tmp_path).trials[0]
    assert base.user_attrs["outcome"] == "invalid"
    assert "never reported its accuracy" in base.user_attrs["failure"]
    assert "the study stops here" in proc.stderr


def test_with_the_accuracy_guard_off_a_script_need_not_report(tmp_path: Path):
    path = own_study(tmp_path, ["--no-report"], trials=2)
    path.write_text(path.read_text().replace("[guard]\n", "[guard]\naccuracy = false\n"))
    proc = knobtune("run", str(path), *FAST, cwd=tmp_path, check=0)
    done = [t for t in load(tmp_path).trials if t.user_attrs.get("outcome") == "ok"]
    assert len(done) == 2 and all("val_accuracy" not in t.user_attrs for t in done)
    assert all(t.user_attrs["feasible"] for t in done) and "speedup" in proc.stdout
    knobtune("export", "own", "-o", "best.json", cwd=tmp_path, check=0)
    assert json.loads((tmp_path / "best.json").read_text())["metrics"]["val_accuracy"] is None


def test_knobs_the_script_never_exercises_are_not_applied_nor_searched(tmp_path: Path):
    proc = knobtune("run", str(own_study(tmp_path, ["--no-autocast"], trials=3)), *FAST, cwd=tmp_path, check=0)
    assert "amp is not searched: the script never enters kt.autocast()" in proc.stderr
    study = load(tmp_path)
    for t in study.trials:
        if t.user_attrs.get("outcome") == "ok":
            assert t.user_attrs["knobs"]["amp"]["applied"] is False
            assert t.user_attrs["knobs"]["amp"]["why"] == "the script never enters kt.autocast()"
            assert t.user_attrs["knobs"]["amp"]["value"] == "off"  # the baseline's value, not a searched one
    assert all("amp" not in t.params for t in study.trials[1:])


def test_nan_guard_stops_a_script_whose_loss_goes_non_finite(tmp_path: Path):
    from knobtune.search.launch.runner import run_child

    request = Request(script=str(SCRIPT), args=("--nan-after", "5", "--epochs", "50"), knobs={"batch_size": 32},
                      burst=Burst(train_samples=640, warmup_samples=64, windows=3))
    child = run_child("pytorch", "burst", request, 120)
    assert child.outcome == "nan", child.failure
    assert child.result.nan_step == 5 and "non-finite at step 5" in child.failure
    # the burst stopped at the next boundary and the script's remaining 50 epochs were not trained
    assert child.result.trained_samples < 640


def test_dict_batches_are_counted_by_their_batch_dimension():
    from knobtune.search.launch.runner import run_child

    request = Request(script=str(SCRIPT), args=("--dict",), knobs={"batch_size": 16},
                      burst=Burst(train_samples=320, warmup_samples=32, windows=2))
    child = run_child("pytorch", "burst", request, 120)
    assert child.outcome == "ok", child.failure
    assert child.result.trained_samples == 320 and child.result.loader["batch_size"] == 16


def test_a_workload_yielding_dict_batches_is_refused_in_one_line(tmp_path: Path):
    from knobtune.search.launch.runner import run_child

    request = Request(workload="kt_test_workloads:dict_batches", knobs={"batch_size": 16},
                      burst=Burst(train_samples=320, warmup_samples=32, windows=2))
    child = run_child("pytorch", "burst", request, 120)
    assert child.outcome == "error"
    assert "yields dict batches (keys pixels, label)" in child.failure and "[study] script" in child.failure


def test_diagnosis_runs_the_scripts_own_step(tmp_path: Path):
    # the script's own loader settings (one worker) are its baseline; the ceilings come from its own loop
    proc = knobtune("diagnose", str(own_study(tmp_path, ["--workers", "1"])), cwd=tmp_path, check=0)
    assert "probing pytorch and script kt_script.py --workers 1" in proc.stderr
    line = [ln for ln in proc.stdout.splitlines() if "baseline:" in ln][0]
    assert "bottleneck: " in line and "input ceiling" in line and "compute ceiling" in line


def test_watchdog_warns_when_production_stays_below_the_confirmed_rate(tmp_path: Path):
    export = {"format": "knobtune.best/1", "framework": "pytorch", "study": "x", "trial": 1,
              "knobs": {"batch_size": 32}, "metrics": {"samples_per_second": 1e9}, "fingerprint": {}}
    (tmp_path / "fast.json").write_text(json.dumps(export))
    # (long enough for three 0.05 s intervals at any speed: the first is not judged, then two below)
    proc = run_script("--epochs", "24", config=tmp_path / "fast.json", cwd=tmp_path,
                      extra_env={"KNOBTUNE_WATCHDOG_S": "0.05"})
    assert proc.returncode == 0, proc.stderr
    assert "more than 20% below" in proc.stderr and "of the confirmed 1,000,000,000" in proc.stderr
    assert stats(proc)["warned"] is True


def test_watchdog_judges_sustained_intervals_only():
    import logging

    from knobtune.trainers.common.production import Watchdog, WatchdogSettings, log

    now = [0.0]
    syncs = []
    dog = Watchdog(96.0, WatchdogSettings(interval_s=1.0, margin=0.2, patience=2), lambda: syncs.append(now[0]),
                   clock=lambda: now[0])
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    log.addHandler(handler)
    level = log.level
    log.setLevel(logging.INFO)
    try:
        def run(rate: float, seconds: float) -> None:
            for _ in range(int(seconds * 8)):  # steps of 1/8 s: exact in binary
                now[0] += 0.125
                dog.step(int(rate / 8))

        dog.resume()
        run(16, 1.0)      # the first interval: warm-up, slow, not judged
        run(96, 1.0)     # on target
        run(48, 1.0)      # one slow interval: not yet sustained
        assert not [r for r in records if "below" in r]
        run(48, 1.0)      # two in a row: a warning
        assert len([r for r in records if "below" in r]) == 1 and dog.stats()["warned"]
        run(48, 2.0)      # still slow: no new warning
        assert len([r for r in records if "below" in r]) == 1
        run(96, 1.0)     # back to speed: said once
        assert any("back to" in r for r in records) and not dog.stats()["warned"]
        dog.pause()
        now[0] += 50.0    # time outside kt.batches (the script's evaluation) is not counted
        dog.resume()
        run(96, 1.0)
        assert dog.stats()["samples_per_second"] == pytest.approx(96)
        # one sync per interval (and at each pause), never per step
        assert len(syncs) <= len(dog.intervals) + 1
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def test_watchdog_leaves_out_intervals_that_recompiled():
    from knobtune.trainers.common.production import Watchdog, WatchdogSettings

    now, graphs = [0.0], [0]
    dog = Watchdog(96.0, WatchdogSettings(interval_s=1.0, margin=0.2, patience=1), lambda: None,
                   clock=lambda: now[0], compilations=lambda: graphs[0])

    def run(rate: float, seconds: float, compile_at: int | None = None) -> None:
        for i in range(int(seconds * 8)):
            now[0] += 0.125
            if i == compile_at:
                graphs[0] += 1
            dog.step(int(rate / 8))

    dog.resume()
    run(8, 1.0, compile_at=0)   # warm-up
    run(96, 1.0)
    run(8, 1.0, compile_at=3)   # a recompilation stalls this interval: reported, not judged
    run(96, 1.0)
    stats = dog.stats()
    assert stats["intervals"] == 4 and stats["judged_intervals"] == 2 and stats["compiling_intervals"] == 1
    assert stats["mean_samples_per_second"] == pytest.approx(96) and not stats["warned"]
    assert stats["samples_per_second"] == pytest.approx(96)
    dog.pause()
    graphs[0] += 1              # compiled off the clock (the script's evaluation): not held against training
    dog.resume()
    run(96, 1.0)
    assert dog.stats()["compiling_intervals"] == 1 and dog.stats()["judged_intervals"] == 3
    run(48, 1.0)                # a slow interval with no compilation is judged
    assert dog.stats()["warned"]


def test_compilations_counts_dynamo_graphs_recompilations_included():
    code = """
import sys, torch
from knobtune.trainers.pytorch.compiled import compilations
assert compilations() == 0 and "torch._dynamo.utils" not in sys.modules  # reading it imports nothing
f = torch.compile(lambda x: x * 2 + 1, backend="eager", dynamic=False)
f(torch.ones(3)); f(torch.ones(3))
print(compilations())
f(torch.ones(5))  # a new shape: a second graph
print(compilations())
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "2"]


def test_time_to_accuracy_evaluates_between_windows_through_the_script():
    from knobtune.search.launch.runner import run_child

    request = Request(script=str(SCRIPT), knobs={"batch_size": 32}, target_accuracy=0.3,
                      burst=Burst(train_samples=1280, warmup_samples=64, windows=10))
    child = run_child("pytorch", "burst", replace(request, args=("--evaluate",)), 120)
    assert child.outcome == "ok", child.failure
    assert child.result.target_reached is True and child.result.evaluations
    assert len(child.result.evaluations) < 10  # it stopped at the target
    child = run_child("pytorch", "burst", request, 120)
    assert child.outcome == "invalid" and "kt.batches(loader, evaluate=fn)" in child.failure


def test_batches_of_namedtuples_and_mappings_move_and_count():
    code = """
from collections import UserDict, namedtuple
import torch
from knobtune.trainers.pytorch.loops import count, to_device
Pair = namedtuple("Pair", "x y")
moved = to_device(Pair(torch.zeros(4, 3), torch.ones(4)), torch.device("cpu"), False)
encoding = UserDict({"input_ids": torch.zeros(5, 7, dtype=torch.long), "labels": torch.ones(5)})
print(type(moved).__name__, count(moved), type(to_device(encoding, torch.device("cpu"), False)).__name__, count(encoding))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["Pair", "4", "UserDict", "5"]
