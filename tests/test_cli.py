"""End to end through the real CLI: run, resume, interrupt, faults, export, dashboard, env."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import optuna
import psutil
import pytest

from knobtune.search.launch.runner import group_members

from conftest import FAST, TINY_BURST, knobtune, study_file

STUDY = """
[study]
name = "tiny"
framework = "pytorch"
workload = "kt_test_workloads:tiny"
trials = 3
seed = 1
prune_below = 0   # these tests are not about pruning; on a busy machine tiny bursts are pruned at random
{burst}
[space]
batch_size = [16, 32]
accumulation_steps = [1]
compile = ["off"]
intra_op_threads = [0, 1]
"""


def load(tmp_path: Path, name: str = "tiny") -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / 'knobtune.db'}")


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    """One 3-trial study, run through the CLI, shared by the tests that only read it."""
    tmp = tmp_path_factory.mktemp("study")
    path = study_file(tmp, STUDY.format(burst=TINY_BURST))
    return tmp, knobtune("run", str(path), *FAST, cwd=tmp, check=0)


def test_run_creates_the_study_with_its_contract(ran):
    tmp, proc = ran
    study = load(tmp)
    trials = study.get_trials()
    assert len(trials) >= 3
    finished = [t for t in trials if t.state.is_finished() and t.state != optuna.trial.TrialState.FAIL]
    assert len(finished) == 3
    base = trials[0]
    assert base.user_attrs["is_baseline"] is True and base.params["batch_size"] == 32
    for t in finished:
        a = t.user_attrs
        for key in ("samples_per_second", "samples_per_second_cv", "warmup_seconds", "val_accuracy",
                    "final_loss", "effective_batch_size", "peak_memory_mb", "outcome", "knobs", "is_baseline"):
            assert key in a, key
        assert a["outcome"] == "ok"
        assert set(a["knobs"]) >= {"num_workers", "pin_memory", "amp", "compile", "batch_size"}
        assert a["knobs"]["pin_memory"] == {"value": False, "applied": False,
                                            "why": "needs CUDA; this machine has no CUDA device"}
        assert t.constraints["outcome"] == 0.0
    attrs = study.user_attrs
    assert attrs["fingerprint"]["hardware"]["device"] == "cpu"
    assert attrs["definition"]["study"]["workload"] == "kt_test_workloads:tiny"
    assert "knobtune_version" in attrs
    # the summary: baseline vs best and the next commands
    assert "baseline" in proc.stdout and "speedup" in proc.stdout
    assert "knobtune export tiny" in proc.stdout and "knobtune dashboard" in proc.stdout
    assert "trial #0" in proc.stderr and "[baseline]" in proc.stderr


def test_export_writes_the_best_in_format(ran):
    tmp, _ = ran
    knobtune("export", "tiny", "-o", "best.json", cwd=tmp, check=0)
    doc = json.loads((tmp / "best.json").read_text())
    assert doc["format"] == "knobtune.best/1" and doc["study"] == "tiny" and doc["framework"] == "pytorch"
    study = load(tmp)
    feasible = [t for t in study.trials if t.user_attrs.get("feasible")]
    best = max(feasible, key=lambda t: t.user_attrs["samples_per_second"])
    assert doc["trial"] == best.number
    assert doc["knobs"]["batch_size"] == best.user_attrs["knobs"]["batch_size"]["value"]
    m = doc["metrics"]
    assert m["speedup"] == pytest.approx(m["samples_per_second"] / m["baseline_samples_per_second"])
    assert {"val_accuracy", "baseline_val_accuracy"} <= set(m)
    assert doc["fingerprint"]["usable_cores"] >= 1 and doc["created"].endswith("+00:00")
    assert doc["not_applied"]["pin_memory"].startswith("needs CUDA")


def test_export_errors(ran):
    tmp, _ = ran
    proc = knobtune("export", "nope", cwd=tmp, check=2)
    assert "no study named 'nope'" in proc.stderr and "it has: tiny" in proc.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dashboard_serves_the_study(ran):
    tmp, _ = ran
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "knobtune", "dashboard", "--port", str(port)], cwd=tmp,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        body = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and body is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5) as response:
                    body = json.loads(response.read())
            except OSError:
                assert proc.poll() is None, proc.stderr.read()
                time.sleep(0.5)
        assert body is not None, "dashboard did not answer"
        names = [s["study_name"] for s in body["study_summaries"]]
        assert "tiny" in names
        study_id = body["study_summaries"][names.index("tiny")]["study_id"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies/{study_id}", timeout=10) as response:
            detail = json.loads(response.read())
        attrs = {a["key"] for a in detail["trials"][0]["user_attrs"]}
        assert {"samples_per_second", "val_accuracy", "outcome"} <= attrs
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_dashboard_port_in_use_is_a_clear_error(tmp_path: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = knobtune("dashboard", "--port", str(port), cwd=tmp_path, timeout=60)
    assert proc.returncode == 2 and f"port {port}" in proc.stderr and "already in use" in proc.stderr


def test_resume_continues_to_the_requested_trials(tmp_path: Path):
    path = study_file(tmp_path, STUDY.format(burst=TINY_BURST).replace("trials = 3", "trials = 2"))
    knobtune("run", str(path), *FAST, cwd=tmp_path, check=0)
    # (.get: a trial pruned as slower than the best has no samples_per_second; which one is pruned
    # depends on the machine's speed at the time)
    first = {t.number: t.user_attrs.get("samples_per_second") for t in load(tmp_path).trials
             if t.user_attrs.get("outcome")}
    assert len(first) == 2
    proc = knobtune("run", str(path), "--trials", "3", *FAST, cwd=tmp_path, check=0)
    assert "resuming, 2 trials done" in proc.stderr
    study = load(tmp_path)
    after = {t.number: t.user_attrs.get("samples_per_second") for t in study.trials if t.user_attrs.get("outcome")}
    assert len(after) == 3 and all(after[n] == v for n, v in first.items())
    assert sum(bool(t.user_attrs.get("is_baseline")) for t in study.trials) == 1
    # the same again: nothing left to do
    proc = knobtune("run", str(path), "--trials", "3", *FAST, cwd=tmp_path, check=0)
    assert len([t for t in load(tmp_path).trials if t.user_attrs.get("outcome")]) == 3
    # a changed measurement definition is refused rather than mixed in
    changed = study_file(tmp_path, STUDY.format(burst=TINY_BURST.replace("640", "960")), "changed.toml")
    proc = knobtune("run", str(changed), cwd=tmp_path, check=2)
    assert "different definition" in proc.stderr and "train_samples: 640 -> 960" in proc.stderr


@pytest.mark.usefixtures("private_fork_servers")
def test_ctrl_c_stops_cleanly_and_keeps_finished_trials(tmp_path: Path):
    body = slow_trials(STUDY.format(burst=TINY_BURST.replace("timeout_s = 120", "timeout_s = 600")))
    path = study_file(tmp_path, body.replace("trials = 3", "trials = 6"))
    log = tmp_path / "stderr.txt"
    with open(log, "a") as stream:  # append mode: our reads never move where the run writes
        # SIGINT as at a terminal: a suite started in the background (CI, `make test &`) inherits it
        # ignored, and Python then installs no KeyboardInterrupt handler in the run
        proc = subprocess.Popen([sys.executable, "-m", "knobtune", "run", str(path), *FAST], cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=stream, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    storage = f"sqlite:///{tmp_path / 'knobtune.db'}"
    child_pgid = None
    deadline = time.monotonic() + 480
    try:
        # wait until one trial has finished (its line is on stderr) and the next one's child runs;
        # the storage is not polled: a second process opening the file as the run creates it races it
        while time.monotonic() < deadline and child_pgid is None and proc.poll() is None:
            time.sleep(0.3)
            if re.search(r"^trial #\d+ ", log_text(log), re.M):
                kids = burst_children(proc.pid)
                if kids:
                    child_pgid = os.getpgid(kids[0].pid)
        assert child_pgid is not None, f"no running trial seen (exit {proc.poll()}):\n{log_text(log)}"
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = log_text(log)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert group_members(child_pgid) == []
    study = optuna.load_study(study_name="tiny", storage=storage)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert done and all(t.user_attrs["outcome"] == "ok" for t in done)
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    stopped = [t for t in study.trials if t.user_attrs.get("failure", "").startswith("interrupted by the user")]
    assert len(stopped) == 1 and stopped[0].state == optuna.trial.TrialState.FAIL
    # and it resumes from there
    proc2 = knobtune("run", str(path), "--trials", str(len(done) + 1), *FAST, cwd=tmp_path, check=0)
    assert f"resuming, {len(done)} trials done" in proc2.stderr


@pytest.mark.usefixtures("private_fork_servers")
def test_a_second_run_of_a_live_study_is_refused_and_a_killed_run_frees_it(tmp_path: Path):
    body = slow_trials(STUDY.format(burst=TINY_BURST.replace("timeout_s = 120", "timeout_s = 600")))
    path = study_file(tmp_path, body.replace("trials = 3", "trials = 8"))
    log = tmp_path / "stderr.txt"
    with open(log, "a") as stream:
        first = subprocess.Popen([sys.executable, "-m", "knobtune", "run", str(path), *FAST], cwd=tmp_path,
                                 stdout=subprocess.DEVNULL, stderr=stream, text=True)
    try:
        def running_trial() -> int | None:
            deadline = time.monotonic() + 480
            while time.monotonic() < deadline and first.poll() is None:
                time.sleep(0.2)
                if re.search(r"^trial #\d+ ", log_text(log), re.M) and burst_children(first.pid):
                    return burst_children(first.pid)[0].pid
            raise AssertionError(f"no running trial seen (exit {first.poll()}):\n{log_text(log)}")

        running_trial()
        second = knobtune("run", str(path), *FAST, cwd=tmp_path, check=2)
        line = second.stderr.strip()
        assert "\n" not in line and f"study 'tiny' on sqlite:///knobtune.db is being run by knobtune (pid {first.pid} " in line
        assert first.poll() is None  # the first run goes on, its live trial untouched
        child = running_trial()
        first.kill()  # SIGKILL: no clean-up runs; the kernel releases the lock, the child dies with its parent
        first.wait(timeout=60)
        if psutil.pid_exists(child):
            psutil.wait_procs([psutil.Process(child)], timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    # (killed mid-trial, as a rule; between a trial's end and the next one's start nothing runs)
    left = [t for t in load(tmp_path).trials if t.state == optuna.trial.TrialState.RUNNING]
    assert len(left) <= 1
    done = len([t for t in load(tmp_path).trials if t.state.is_finished() and t.user_attrs.get("outcome")])
    third = knobtune("run", str(path), "--trials", str(done + 1), *FAST, cwd=tmp_path, check=0)
    assert ("marked 1 trial(s) left running by an earlier run as failed" in third.stderr) == bool(left)
    assert not list(tmp_path.glob("*.lock"))  # released when the run ended


def slow_trials(body: str) -> str:
    """The tiny study with trials that take seconds (a forked child otherwise finishes its tiny
    burst in well under one: too quickly to be caught running)."""
    body = body.replace('workload = "kt_test_workloads:tiny"', 'workload = "kt_test_workloads:paced"')
    return body.replace("[space]", "[workload]\nslow = [16, 32]\nstep_cost = 0.1\n[space]")


def log_text(log: Path) -> str:
    return log.read_text(errors="replace")


def burst_children(pid: int) -> list[psutil.Process]:
    """The knobtune process's running trial children (a probe that just exited may be a zombie):
    fresh ones (``python -m knobtune.trainers.pytorch burst``) and ones forked by its warm server (named
    kt-burst), each the leader of its own process group."""
    out = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            fresh = "knobtune.trainers.pytorch" in " ".join(child.cmdline()) and "burst" in child.cmdline()
            if (fresh or child.name() == "kt-burst") and os.getpgid(child.pid) == child.pid \
                    and child.status() != psutil.STATUS_ZOMBIE:
                out.append(child)
        except (psutil.Error, ProcessLookupError):
            pass
    return out


FAULTS = """
[study]
name = "faults"
framework = "pytorch"
workload = "kt_test_workloads:{factory}"
trials = {trials}
seed = 3
{burst}
[baseline]
batch_size = 32
[space]
batch_size = [16, 32]
accumulation_steps = [1]
compile = ["off"]
amp = ["off"]
num_workers = [0]
intra_op_threads = [0]
optimizer_impl = ["default"]
[workload]
{option}
"""


def test_a_diverging_trial_is_nan_and_the_study_goes_on(tmp_path: Path):
    path = study_file(tmp_path, FAULTS.format(factory="diverge", trials=2, burst=TINY_BURST, option="bad_batch = 16"))
    proc = knobtune("run", str(path), *FAST, cwd=tmp_path, check=0)
    study = load(tmp_path, "faults")
    outcomes = {t.params.get("batch_size"): t for t in study.trials if t.user_attrs.get("outcome")}
    nan = outcomes[16]
    assert nan.user_attrs["outcome"] == "nan" and nan.user_attrs["nan_step"] == 0
    assert nan.state == optuna.trial.TrialState.PRUNED and nan.constraints["outcome"] == 1.0
    assert "non-finite" in nan.user_attrs["failure"]
    assert outcomes[32].user_attrs["outcome"] == "ok"
    assert "1 nan" in proc.stdout
    knobtune("export", "faults", "-o", "best.json", cwd=tmp_path, check=0)
    assert json.loads((tmp_path / "best.json").read_text())["knobs"]["batch_size"] == 32


def test_a_crashing_trial_is_recorded_and_the_study_goes_on(tmp_path: Path):
    path = study_file(tmp_path, FAULTS.format(factory="abort", trials=2, burst=TINY_BURST, option="batch = 16"))
    knobtune("run", str(path), *FAST, cwd=tmp_path, check=0)
    study = load(tmp_path, "faults")
    crashed = [t for t in study.trials if t.user_attrs.get("outcome") == "crash"]
    assert len(crashed) == 1 and "SIGABRT" in crashed[0].user_attrs["failure"]
    assert crashed[0].state == optuna.trial.TrialState.PRUNED


def test_a_failing_baseline_stops_the_run_and_export_says_why(tmp_path: Path):
    path = study_file(tmp_path, FAULTS.format(factory="abort", trials=3, burst=TINY_BURST, option=""))
    proc = knobtune("run", str(path), *FAST, cwd=tmp_path, check=1)
    assert "baseline trial #0 did not succeed (crash" in proc.stderr
    proc = knobtune("export", "faults", cwd=tmp_path, check=2)
    assert "has no feasible trial to export (1 crash)" in proc.stderr


def test_bad_workloads_are_exit_2_before_any_trial(tmp_path: Path):
    for workload, expected in [
        ("kt_broken_module:factory", "cannot import module 'kt_broken_module'"),
        ("kt_test_workloads:not_a_workload", "expected knobtune.pytorch.Workload"),
        ("kt_test_workloads:missing", "has no attribute 'missing'"),
    ]:
        path = study_file(tmp_path, f'[study]\nname = "w"\nframework = "pytorch"\nworkload = "{workload}"\n')
        proc = knobtune("run", str(path), cwd=tmp_path, check=2)
        assert expected in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 2  # the probing line, then the error


def test_env_prints_the_fingerprint(tmp_path: Path):
    proc = knobtune("env", cwd=tmp_path, check=0)
    for key in ("cpu_model", "usable_cores", "memory_mb", "python", "optuna", "pytorch torch", "cuda_available"):
        assert key in proc.stdout
    report = json.loads(knobtune("env", "--json", cwd=tmp_path, check=0).stdout)
    assert report["frameworks"]["pytorch"]["torch"].startswith("2.")


@pytest.mark.usefixtures("private_fork_servers")
def test_a_killed_run_leaves_no_trial_running_and_resumes(tmp_path: Path):
    body = STUDY.format(burst=TINY_BURST.replace("timeout_s = 120", "timeout_s = 600"))
    body = body.replace('workload = "kt_test_workloads:tiny"', 'workload = "kt_test_workloads:sleepy"')
    body = body.replace("[space]", "[workload]\nseconds = 0.01\n[baseline]\nnum_workers = 1\n[space]")
    path = study_file(tmp_path, body)
    proc = subprocess.Popen([sys.executable, "-m", "knobtune", "run", str(path), *FAST], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    kids: list[psutil.Process] = []
    while time.monotonic() < deadline and not kids:
        time.sleep(0.3)
        kids = burst_children(proc.pid)
    assert kids, "no trial child seen"
    while time.monotonic() < deadline and not kids[0].children():
        time.sleep(0.1)  # until it has started its DataLoader worker
    assert kids[0].children(), "the trial never started its DataLoader worker"
    pgid = os.getpgid(kids[0].pid)
    proc.kill()  # SIGKILL: no cleanup code in knobtune runs
    proc.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and group_members(pgid):
        time.sleep(0.5)
    assert group_members(pgid) == []
    # the trial it left RUNNING is marked failed on resume, and the study goes on
    proc2 = knobtune("run", str(path), "--trials", "1", *FAST, cwd=tmp_path, check=0)
    assert "marked 1 trial(s) left running by an earlier run as failed" in proc2.stderr
    study = load(tmp_path)
    assert study.trials[0].state == optuna.trial.TrialState.FAIL
    assert [t.user_attrs["outcome"] for t in study.trials if "outcome" in t.user_attrs] == ["ok"]
