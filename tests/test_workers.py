"""Several workers on one study, on a real PostgreSQL server (tests/pg.py): the study-wide trial
count, confirmation exactly once, a killed worker's trial failed by heartbeat and re-run, Ctrl-C
on one worker, a lost database, and what a worker refuses. The workers here share one 2-core
machine, so their numbers are noisy by design: nothing asserts on speed."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import pytest
from conftest import TINY_BURST, knobtune, study_file
from optuna.trial import TrialState
from pg import PASSWORD, PostgresServer

from search import workers
from search.lease import Lease

STUDY = """
[study]
name = "shared"
framework = "pytorch"
workload = "{workload}"
trials = {trials}
seed = 5
prune_below = 0
{burst}
[baseline]
batch_size = 32
[space]
batch_size = [16, 32, 64]
accumulation_steps = [1]
num_workers = [0]
compile = ["off"]
intra_op_threads = [0]
amp = ["off", "bf16"]
[confirm]
top_k = 1
repeats = 2
noisy_repeats = 2
{extra}
"""
# (every batch size sleeps per step: a trial lasts seconds, long enough to be caught running)
PACED = "[workload]\nslow = [16, 32, 64]\nstep_cost = 0.25"
BEAT = ("--heartbeat", "1", "--grace", "4")


@pytest.fixture(scope="module")
def server():
    with PostgresServer() as running:
        yield running


def worker(path: Path, url: str, *extra: str, log: str) -> subprocess.Popen:
    """A ``knobtune worker`` in the background; its output goes to ``log`` (stdout) and ``log.err``."""
    cmd = [sys.executable, "-m", "search.cli", "worker", str(path), "--storage", url, *extra]
    return subprocess.Popen(cmd, cwd=path.parent, stdout=open(path.parent / log, "w"),
                            stderr=open(path.parent / f"{log}.err", "w"), text=True)


def stderr(path: Path, log: str) -> str:
    return (path.parent / f"{log}.err").read_text()


def load(url: str) -> optuna.Study:
    return optuna.load_study(study_name="shared", storage=url)


def wait_for(condition, timeout: float = 180, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def running_of(url: str, pid: int) -> list[optuna.trial.FrozenTrial]:
    try:
        return [t for t in load(url).get_trials(states=(TrialState.RUNNING,))
                if str(t.user_attrs.get("worker", "")).endswith(f":{pid}")]
    except Exception:  # noqa: BLE001 - the study (or its tables) do not exist yet
        return []


def test_two_workers_share_the_count_and_confirm_once(tmp_path: Path, server: PostgresServer):
    url = server.database("two_workers")
    path = study_file(tmp_path, STUDY.format(workload="kt_test_workloads:tiny", trials=5, burst=TINY_BURST, extra=""))
    procs = [worker(path, url, *BEAT, "--no-diagnose", log=f"w{i}") for i in range(2)]
    codes = [p.wait(timeout=600) for p in procs]
    logs = [stderr(path, f"w{i}") for i in range(2)]
    assert codes == [0, 0], logs
    study = load(url)
    finished = [t for t in study.trials if t.state.is_finished() and t.state != TrialState.FAIL]
    assert len(finished) == 5  # the count is the study's, not each worker's
    assert sum(bool(t.user_attrs.get("is_baseline")) for t in finished) == 1
    params = [tuple(sorted(t.params.items())) for t in finished]
    assert len(set(params)) == len(params)  # no configuration measured twice, across workers
    ids = {f"{p.pid}" for p in procs}
    assert {t.user_attrs["worker"].rsplit(":", 1)[1] for t in finished} <= ids
    # confirmation ran once, by one worker; the other said so and exited 0
    assert study.user_attrs["confirmed"]["after_trials"] == 5
    confirming = [log for log in logs if "confirming 1 candidate(s)" in log]
    deferring = [log for log in logs if "is confirming and diagnosing the winner of 'shared'; this worker is done" in log]
    assert len(confirming) == 1 and len(deferring) == 1, logs
    # a machine that differs from the study's (here: a share of the cores instead of all) is refused
    proc = knobtune("worker", str(path), "--storage", url, "--jobs", "2", cwd=tmp_path, check=2)
    assert "different hardware" in proc.stderr and "usable_cores" in proc.stderr
    assert PASSWORD not in proc.stderr + proc.stdout


def _children_of(directory: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cwd", "cmdline"]):
        try:
            if proc.info["cwd"] == str(directory) and "trainers" in " ".join(proc.info["cmdline"] or []):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def test_a_killed_worker_trial_is_rerun_and_ctrl_c_stops_one_worker(tmp_path: Path, server: PostgresServer):
    url = server.database("faults")
    path = study_file(tmp_path, STUDY.format(workload="kt_test_workloads:paced", trials=3, burst=TINY_BURST,
                                             extra=PACED))
    # a worker dies with SIGKILL in the middle of a trial (here the baseline): nothing tells the study
    first = worker(path, url, *BEAT, "--no-confirm", "--no-diagnose", log="killed")
    wait_for(lambda: running_of(url, first.pid), what="the first worker's trial")
    time.sleep(1.5)
    lost = running_of(url, first.pid)[0]
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    wait_for(lambda: not _children_of(tmp_path), timeout=30, what="its training child to die with it")

    # two live workers: the dead one's trial is failed once its heartbeat is older than the grace,
    # and its configuration re-run; then one of them is stopped with Ctrl-C in a trial of its own
    second = worker(path, url, *BEAT, "--no-confirm", "--no-diagnose", log="interrupted")
    third = worker(path, url, *BEAT, "--no-confirm", "--no-diagnose", log="survivor")
    wait_for(lambda: running_of(url, second.pid) or second.poll() is not None, what="the second worker's trial")
    if second.poll() is None:
        stopped = running_of(url, second.pid)[0]
        second.send_signal(signal.SIGINT)
        assert second.wait(timeout=90) == 130, stderr(path, "interrupted")
    else:  # (the survivor took every trial first: nothing of the second's to stop)
        stopped = None
    assert third.wait(timeout=600) == 0, stderr(path, "survivor")

    study = load(url)
    dead = study.trials[lost.number]
    assert dead.state == TrialState.FAIL
    assert f":{first.pid} stopped sending heartbeats" in dead.user_attrs["failure"]
    retried = [t for t in study.trials if t.user_attrs.get("retry_of") == lost.number]
    assert retried and retried[0].params == lost.params
    assert retried[0].user_attrs.get("is_baseline") == lost.user_attrs.get("is_baseline")
    finished = [t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(finished) == 3  # the study reached its count: nothing lost, nothing counted twice
    if stopped is not None:
        cut = study.trials[stopped.number]
        assert cut.state == TrialState.FAIL and "interrupted by the user" in cut.user_attrs["failure"]
        assert any(t.user_attrs.get("retry_of") == stopped.number for t in study.trials)
    assert not _children_of(tmp_path)


def test_a_worker_that_loses_the_database_stops_in_one_line(tmp_path: Path):
    path = study_file(tmp_path, STUDY.format(workload="kt_test_workloads:paced", trials=3, burst=TINY_BURST,
                                             extra=PACED))
    with PostgresServer() as own:  # (its own server: this test stops it)
        url = own.database("lost")
        proc = worker(path, url, *BEAT, "--db-retry", "4", "--no-confirm", "--no-diagnose", log="lost")
        wait_for(lambda: running_of(url, proc.pid), what="a running trial")
        own.stop()
        code = proc.wait(timeout=120)
    err = stderr(path, "lost")
    assert code == 1, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("knobtune: run failed: lost the database postgresql://knobtune:***@127.0.0.1:")
    assert "--db-retry 4" in last and "Traceback" not in err and PASSWORD not in err
    assert "is unreachable" in err  # it said it was retrying first
    assert not _children_of(tmp_path)


def test_a_worker_refuses_sqlite_and_bad_heartbeats(tmp_path: Path):
    path = study_file(tmp_path, STUDY.format(workload="kt_test_workloads:tiny", trials=3, burst=TINY_BURST, extra=""))
    proc = knobtune("worker", str(path), cwd=tmp_path, check=2)
    assert "knobtune worker needs a database server" in proc.stderr and "knobtune run --jobs N" in proc.stderr
    proc = knobtune("worker", str(path), "--storage", "postgresql://u:pw@127.0.0.1:9/x", "--heartbeat", "10",
                    "--grace", "5", cwd=tmp_path, check=2)
    assert "--grace must be longer than --heartbeat" in proc.stderr


def test_leases_go_to_one_holder_and_expire(tmp_path: Path, server: PostgresServer):
    import sqlalchemy as sa

    engine = sa.create_engine(server.database("leases"))
    a, b = Lease(engine, "study/after-search", "a:1", ttl_s=2), Lease(engine, "study/after-search", "b:2", ttl_s=2)
    assert a.claim() is None and b.claim() == "a:1"
    assert a.renew() and b.claim() == "a:1"
    time.sleep(3)  # a stopped renewing (its machine vanished): b takes over, a has lost it
    assert b.claim() is None and not a.renew() and a.claim() == "b:2"
    b.release()
    assert a.claim() is None


def test_patience_with_a_lost_database_is_bounded_and_redacted():
    from sqlalchemy.exc import OperationalError

    calls, said = [], []

    def step():
        calls.append(1)
        raise OperationalError("SELECT 1", {}, Exception("connection refused by postgresql://u:hunter2@db/x"))

    with pytest.raises(workers.DatabaseLost) as info:
        workers.patiently(step, "postgresql://u:hunter2@db/x", budget_s=0.0, say=said.append, sleep=lambda s: None)
    assert "hunter2" not in str(info.value) and "postgresql://u:***@db/x" in str(info.value)
    assert len(calls) == 1
    flaky = iter([OperationalError("x", {}, Exception("gone")), OperationalError("x", {}, Exception("gone")), None])

    def recovers():
        exc = next(flaky)
        if exc:
            raise exc
        return "ok"

    pauses: list[float] = []
    assert workers.patiently(recovers, "postgresql://db/x", 60, said.append, sleep=pauses.append) == "ok"
    assert pauses == [1, 2] and len(said) == 1
    with pytest.raises(ValueError):  # not a connection error: not retried
        workers.patiently(lambda: int("x"), "postgresql://db/x", 60, said.append, sleep=pauses.append)
    assert workers.sampler_seed(4, "a:1") != workers.sampler_seed(4, "a:2")
    assert os.environ.get("KNOBTUNE_STORAGE") is None
