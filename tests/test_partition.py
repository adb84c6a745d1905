"""Trials at once on one machine (``--jobs``): the partitioning (gated on fake device lists here;
the GPU side runs for real in benchmarks/gpu_check.sh) and a real two-slot run on this machine's
cores, read back from the children."""
from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from knobtune.search.errors import UserError
from knobtune.search.launch import partition

from conftest import FAST, TINY_BURST, knobtune, study_file

STUDY = """
[study]
name = "jobs"
framework = "pytorch"
workload = "kt_test_workloads:tiny"
trials = 5
seed = 3
prune_below = 0
{burst}
[space]
batch_size = [16, 32, 64]
accumulation_steps = [1]
compile = ["off"]
amp = ["off", "bf16"]
"""


def test_cores_divide_into_equal_shares_and_gpus_one_each():
    assert partition.plan(2, [0, 1], []) == [partition.Partition(0, (0,)), partition.Partition(1, (1,))]
    eight = list(range(8))
    parts = partition.plan(3, eight, ["0", "1", "2"])
    assert [p.cores for p in parts] == [(0, 1), (2, 3), (4, 5)]  # equal shares; cores 6 and 7 unused
    assert [p.gpu for p in parts] == ["0", "1", "2"]
    assert not set(parts[0].cores) & set(parts[1].cores)
    assert parts[1].env({"PATH": "/bin"}) == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "1"}
    assert partition.Partition(0, (0,)).env({"A": "b"}) == {"A": "b"}  # a CPU share leaves the GPUs alone


@pytest.mark.parametrize("jobs, cores, gpus, message", [
    (3, [0, 1], [], "--jobs 3: this machine has 2 usable core(s) (0, 1); each trial needs at least one"),
    (3, list(range(16)), ["0", "1"], "--jobs 3: this machine has 2 GPU(s) (0, 1); at most one trial per GPU"),
])
def test_more_jobs_than_devices_says_what_exists(jobs, cores, gpus, message):
    with pytest.raises(UserError) as caught:
        partition.plan(jobs, cores, gpus)
    assert str(caught.value) == message


def test_hyperthreads_of_one_core_stay_in_one_share(tmp_path: Path):
    for cpu, siblings in {0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3"}.items():  # a 2-core, 4-thread layout
        (tmp_path / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (tmp_path / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(siblings + "\n")
    groups = partition.physical_groups([0, 1, 2, 3], root=str(tmp_path))
    assert groups == [(0, 2), (1, 3)]
    assert [p.cores for p in partition.plan(2, [0, 1, 2, 3], [], groups)] == [(0, 2), (1, 3)]
    with pytest.raises(UserError, match=r"--jobs 3: this machine has 2 physical core\(s\) \(0\+2 1\+3"):
        partition.plan(3, [0, 1, 2, 3], [], groups)
    assert partition.physical_groups([5], root=str(tmp_path / "none")) == [(5,)]  # no topology: a core each
    assert partition.jobs_count("auto", ["0", "1", "2", "3"], cores=2) == 2  # never more trials than cores


def test_jobs_auto_is_one_per_gpu_and_one_on_a_cpu_box():
    assert partition.jobs_count("auto", ["0", "1", "2", "3"]) == 4
    assert partition.jobs_count("auto", []) == 1
    assert partition.jobs_count(None, ["0", "1"]) == 1  # the default stays the whole machine
    assert partition.jobs_count("2", []) == 2
    for bad in ("0", "-1", "two"):
        with pytest.raises(UserError, match=f"--jobs {bad}|--jobs '{bad}'"):
            partition.jobs_count(bad, [])


def test_a_restricted_box_hands_out_its_own_gpus():
    assert partition.visible_gpus(2, {"CUDA_VISIBLE_DEVICES": "2,3"}) == ["2", "3"]
    assert partition.visible_gpus(2, {"CUDA_VISIBLE_DEVICES": "GPU-a1,GPU-b2"}) == ["GPU-a1", "GPU-b2"]
    assert partition.visible_gpus(2, {}) == ["0", "1"]
    assert partition.visible_gpus(0, {}) == []


def test_two_jobs_run_trials_at_once_each_on_its_own_core(tmp_path: Path):
    cores = partition.machine_cores()
    if len(cores) < 2:
        pytest.skip(f"needs 2 usable cores, this machine gives {len(cores)}")
    # (two baseline runs: they go side by side, one per share)
    path = study_file(tmp_path, STUDY.format(burst=TINY_BURST.replace("baseline_runs = 1", "baseline_runs = 2")))
    proc = knobtune("run", str(path), *FAST, "--jobs", "2", cwd=tmp_path, check=0)
    assert "2 trials at once, each pinned to 1 core(s)" in proc.stderr
    study = optuna.load_study(study_name="jobs", storage=f"sqlite:///{tmp_path / 'knobtune.db'}")
    assert study.user_attrs["partition"]["jobs"] == 2 and study.user_attrs["partition"]["cores_per_trial"] == 1
    assert study.user_attrs["fingerprint"]["usable_cores"] == 1  # the probe ran on one share
    measured = [t for t in study.trials if t.user_attrs.get("outcome")]
    assert len(measured) >= 5
    runs = measured[0].user_attrs["baseline_runs"]
    assert len(runs) == 2 and sorted(r["placement"]["affinity"] for r in runs) == [[c] for c in cores[:2]]
    for t in measured:  # every child read back its own placement: one core, its partition's
        assert t.user_attrs["placement"]["affinity"] == t.user_attrs["partition"]["cores"]
        assert len(t.user_attrs["placement"]["affinity"]) == 1
        assert t.user_attrs["placement"]["cuda_visible_devices"] is None  # a CPU share leaves GPUs alone
    overlapping = [(a, b) for a in measured for b in measured if a.number < b.number
                   and a.datetime_start < b.datetime_complete and b.datetime_start < a.datetime_complete]
    assert overlapping  # trials really ran at once
    for a, b in overlapping:  # and never on the same core
        assert not set(a.user_attrs["placement"]["affinity"]) & set(b.user_attrs["placement"]["affinity"])
    skipped = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert all(t.user_attrs.get("duplicate_of") is not None for t in skipped)
    assert len(skipped) <= len(measured)  # duplicates of running trials wait for one to end, not a spin
    knobtune("export", "jobs", "-o", "best.json", cwd=tmp_path, check=0)
    exported = json.loads((tmp_path / "best.json").read_text())
    assert exported["partition"]["jobs"] == 2 and "1/2 of the machine" in exported["partition"]["share"]
    # resuming on the whole machine would mix numbers of two shares: refused, saying how to resume
    again = knobtune("run", str(path), *FAST, "--trials", "6", cwd=tmp_path, check=2)
    assert "its trials ran with --jobs 2" in again.stderr and "pass the same --jobs to resume it" in again.stderr
    # a diagnosis on its own measures on the share the trials had, not on the whole machine
    diag = knobtune("diagnose", str(path), cwd=tmp_path, check=0)
    assert "ran with --jobs 2: diagnosing on one such share (1 core(s))" in diag.stderr
    assert "winner (trial #" in diag.stdout


@pytest.mark.parametrize("jobs, message", [
    ("3", "--jobs 3: this machine has 2 usable core(s)"),
    ("0", "--jobs 0: expected a number >= 1 or 'auto'"),
])
def test_bad_jobs_stop_before_any_trial(tmp_path: Path, jobs: str, message: str):
    if len(partition.machine_cores()) != 2 and jobs == "3":
        pytest.skip("the message names this machine's 2 cores")
    path = study_file(tmp_path, STUDY.format(burst=TINY_BURST))
    proc = knobtune("run", str(path), *FAST, "--jobs", jobs, cwd=tmp_path, check=2)
    assert message in proc.stderr and "trial #" not in proc.stderr
