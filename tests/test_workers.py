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
from optuna.trial import TrialState

from knobtune.search.launch import partition
from knobtune.search.storage import workers
from knobtune.search.storage.lease import Lease

from conftest import TINY_BURST, knobtune, study_file
from pg import PASSWORD, PostgresServer

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
optimizer_impl = ["default"]
amp = ["off", "bf16"]
[confirm]
top_k = 1
repeats = 2
noisy_repeats = 2
{extra}
"""
# (every batch size sleeps per step: a trial lasts seconds, long enough to be caught running)
PACED = "[workload]\nslow = [16, 32, 64]\nstep_cost = 0.25"
BEAT = ("--heartbeat", "1", "--grace", "6")


@pytest.fixture(scope="module")
def server():
    with PostgresServer() as running:
        yield running


def cores() -> list[int]:
    found = partition.machine_cores()
    if len(found) < 2:
        pytest.skip(f"two workers pinned to a core each need 2 usable cores, this machine gives {len(found)}")
    return found


def worker(path: Path | None, url: str, *extra: str, log: str, core: int | None = None,
           cwd: Path | None = None) -> subprocess.Popen:
    """A ``knobtune worker`` in the background, pinned to ``core`` (as if it were a machine of its
    own: its children inherit the affinity); its output goes to ``log`` and ``log.err``."""
    cwd = cwd or path.parent  # type: ignore[union-attr]
    cmd = [sys.executable, "-m", "knobtune", "worker", *([str(path)] if path else []), "--storage", url, *extra]
    def start() -> None:
        # SIGINT as at a terminal: a suite started in the background (CI, `make test &`) ignores it
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if core is not None:
            os.sched_setaffinity(0, {core})
    return subprocess.Popen(cmd, cwd=cwd, stdout=open(cwd / log, "w"), stderr=open(cwd / f"{log}.err", "w"),
                            text=True, preexec_fn=start)


def no_two_at_once_on_one_core(study: optuna.Study) -> None:
    """Every child read back its affinity: trials that ran at the same time never shared a core."""
    measured = [t for t in study.trials if t.state != TrialState.FAIL and t.user_attrs.get("placement")]
    assert measured
    for a in measured:
        for b in measured:
            if a.number < b.number and a.datetime_start < b.datetime_complete and b.datetime_start < a.datetime_complete:
                assert not set(a.user_attrs["placement"]["affinity"]) & set(b.user_attrs["placement"]["affinity"])
                assert a.user_attrs["placement"]["cuda_visible_devices"] is None


def stderr(path: Path, log: str) -> str:
    return (path.parent / f"{log}.err").read_text()


def load(url: str) -> optuna.Study:
    return optuna.load_study(study_name="shared", storage=url)


def wait_for(condition, timeout: float = 180, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def exists(url: str) -> bool:
    try:
        return "shared" in optuna.get_all_study_names(url)
    except Exception:  # noqa: BLE001 - its tables are being created
        return False


def running_of(url: str, pid: int) -> list[optuna.trial.FrozenTrial]:
    try:
        return [t for t in load(url).get_trials(states=(TrialState.RUNNING,))
                if f":{pid}:" in str(t.user_attrs.get("worker", ""))]
    except Exception:  # noqa: BLE001 - the study (or its tables) do not exist yet
        return []


def still_running(url: str, pid: int, seconds: float = 1.0) -> list[int]:
    """A trial of the worker ``pid`` that is running now and still a second later, or []."""
    first = {t.number for t in running_of(url, pid)}
    if not first:
        return []
    time.sleep(seconds)
    return sorted(first & {t.number for t in running_of(url, pid)})[:1]


def test_two_workers_share_the_count_and_confirm_once(tmp_path: Path, server: PostgresServer):
    url = server.database("two_workers")
    pins = cores()
    path = study_file(tmp_path, STUDY.format(workload="kt_test_workloads:tiny", trials=5, burst=TINY_BURST, extra=""))
    first = worker(path, url, *BEAT, "--no-diagnose", log="w0", core=pins[0])
    # the second joins with no study file: the definition comes from the storage
    wait_for(lambda: exists(url) or first.poll() is not None, what="the study")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    second = worker(None, url, "--name", "shared", *BEAT, "--no-diagnose", log="w1", core=pins[1], cwd=elsewhere)
    procs = [first, second]
    codes = [p.wait(timeout=600) for p in procs]
    logs = [stderr(path, "w0"), (elsewhere / "w1.err").read_text()]
    assert codes == [0, 0], logs
    study = load(url)
    finished = [t for t in study.trials if t.state.is_finished() and t.state != TrialState.FAIL]
    assert len(finished) == 5  # the count is the study's, not each worker's
    assert sum(bool(t.user_attrs.get("is_baseline")) for t in finished) == 1
    params = [tuple(sorted(t.params.items())) for t in finished]
    assert len(set(params)) == len(params)  # no configuration measured twice, across workers
    ids = {f"{p.pid}" for p in procs}
    assert {t.user_attrs["worker"].split(":")[1] for t in finished} <= ids
    no_two_at_once_on_one_core(study)
    assert "joining" in logs[1]
    # confirmation ran once, by one worker; the other said so and exited 0
    assert study.user_attrs["confirmed"]["after_trials"] == 5
    confirming = [log for log in logs if "confirming 1 candidate(s)" in log]
    deferring = [log for log in logs if "is confirming and diagnosing the winner of 'shared'; this worker is done" in log
                 or "was confirmed and diagnosed by another worker" in log]
    assert len(confirming) == 1 and len(deferring) == 1, logs
    # a machine that differs from the study's (here: both cores instead of one) is refused
    proc = knobtune("worker", str(path), "--storage", url, cwd=tmp_path, check=2)
    assert "different hardware" in proc.stderr and "usable_cores: 1 -> 2" in proc.stderr
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


@pytest.mark.usefixtures("private_fork_servers")
def test_a_killed_worker_trial_is_rerun_and_ctrl_c_stops_one_worker(tmp_path: Path, server: PostgresServer):
    url = server.database("faults")
    path = study_file(tmp_path, STUDY.format(workload="kt_test_workloads:paced", trials=3, burst=TINY_BURST,
                                             extra=PACED))
    # a worker dies with SIGKILL in the middle of a trial (here the baseline): nothing tells the study
    pins = cores()
    first = worker(path, url, *BEAT, "--no-confirm", "--no-diagnose", log="killed", core=pins[0])
    caught: list[optuna.trial.FrozenTrial] = []
    wait_for(lambda: caught.extend(running_of(url, first.pid)) or caught, what="the first worker's trial")
    time.sleep(1.5)
    lost = caught[0]
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    wait_for(lambda: not _children_of(tmp_path), timeout=30, what="its training child to die with it")

    # two live workers: the dead one's trial is failed once its heartbeat is older than the grace,
    # and its configuration re-run; then one of them is stopped with Ctrl-C in a trial of its own
    second = worker(path, url, *BEAT, "--no-confirm", "--no-diagnose", log="interrupted", core=pins[0])
    third = worker(path, url, *BEAT, "--no-confirm", "--no-diagnose", log="survivor", core=pins[1])
    steady: list[int] = []
    wait_for(lambda: steady.extend(still_running(url, second.pid)) or steady or second.poll() is not None,
             what="a trial of the second worker's")
    if steady:  # (a trial sleeps 5 s: it is still running when the Ctrl-C lands)
        second.send_signal(signal.SIGINT)
        assert second.wait(timeout=90) == 130, stderr(path, "interrupted")
    assert third.wait(timeout=600) == 0, stderr(path, "survivor")

    study = load(url)
    dead = study.trials[lost.number]
    assert dead.state == TrialState.FAIL
    assert f":{first.pid}:" in dead.user_attrs["failure"] and "stopped sending heartbeats" in dead.user_attrs["failure"]
    retried = [t for t in study.trials if t.user_attrs.get("retry_of") == lost.number]
    # (compared with the trial as stored: the snapshot may predate its parameters)
    assert retried and retried[0].params == dead.params
    assert retried[0].user_attrs.get("is_baseline") == dead.user_attrs.get("is_baseline")
    finished = [t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(finished) == 3  # the study reached its count: nothing lost, nothing counted twice
    no_two_at_once_on_one_core(study)
    if steady:  # Ctrl-C stopped the second worker's own trial, which went back to the queue
        cut = study.trials[steady[0]]
        assert cut.state == TrialState.FAIL and "interrupted by the user" in cut.user_attrs["failure"]
        assert any(t.user_attrs.get("retry_of") == cut.number for t in study.trials)
    else:  # (the survivor took every trial first: nothing of the second's to stop)
        assert second.wait(timeout=90) == 0
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
    assert "the limit: 4 s" in last and "Traceback" not in err and PASSWORD not in err
    assert "is unreachable" in err  # it said it was retrying first
    assert not _children_of(tmp_path)


def test_a_worker_refuses_sqlite_a_missing_study_and_bad_heartbeats(tmp_path: Path, server: PostgresServer):
    path = study_file(tmp_path, STUDY.format(workload="kt_test_workloads:tiny", trials=3, burst=TINY_BURST, extra=""))
    proc = knobtune("worker", str(path), cwd=tmp_path, check=2)
    assert "knobtune worker needs a database server" in proc.stderr and "knobtune run --jobs N" in proc.stderr
    assert "cannot be shared over the network" in proc.stderr
    url = server.database("empty")
    proc = knobtune("worker", "--name", "nowhere", "--storage", url, cwd=tmp_path, check=2)
    assert "study 'nowhere' does not exist on postgresql://knobtune:***@" in proc.stderr
    assert "no study file was given to create it" in proc.stderr and PASSWORD not in proc.stderr
    proc = knobtune("worker", "--storage", url, cwd=tmp_path, check=2)
    assert "needs STUDY.toml, or --name NAME" in proc.stderr
    proc = knobtune("worker", str(path), "--storage", "postgresql://u:pw@127.0.0.1:9/x", "--heartbeat", "10",
                    "--grace", "5", cwd=tmp_path, check=2)
    assert "--grace must be longer than --heartbeat" in proc.stderr


def test_leases_go_to_one_holder_and_expire(tmp_path: Path, server: PostgresServer):
    import sqlalchemy as sa

    engine = sa.create_engine(server.database("leases"))
    a, b = Lease(engine, "study/after-search", "a:1", ttl_s=4), Lease(engine, "study/after-search", "b:2", ttl_s=4)
    assert a.claim() is None and b.claim() == "a:1"
    assert a.renew() and b.claim() == "a:1"
    time.sleep(5)  # a stopped renewing (its machine vanished): b takes over, a has lost it
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


def test_a_study_left_half_created_is_taken_up(tmp_path: Path):
    # a worker that died (or lost the database) between creating the study and writing its
    # attributes leaves an empty study: the next one completes it instead of calling it foreign
    from knobtune.search.storage import database
    from knobtune.search.study import definition
    from knobtune.search.study import study as study_mod

    path = study_file(tmp_path, STUDY.format(workload="kt_test_workloads:tiny", trials=3, burst=TINY_BURST, extra=""))
    parsed = definition.load(path)
    url = f"sqlite:///{tmp_path / 'k.db'}"
    optuna.create_study(study_name="shared", storage=url)
    fingerprint = {"cpu_model": "x", "usable_cores": 2}
    taken, created = study_mod.load_or_create(database.open_storage(url), "shared", parsed, fingerprint,
                                              optuna.samplers.RandomSampler())
    assert created and taken.user_attrs["measurement"] == parsed.measurement_key()
    again, created = study_mod.load_or_create(database.open_storage(url), "shared", parsed, fingerprint,
                                              optuna.samplers.RandomSampler())
    assert not created and again._study_id == taken._study_id
