"""The warm start: trial children forked from a server that imported the framework once. Each
child still gets its own knobs, and a crash, hang, NaN or a dead server in one leaves the next
unaffected; a killed parent leaves neither server nor child behind."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from knobtune.search.launch import forkserver
from knobtune.search.launch.runner import group_members, run_child
from knobtune.spaces import for_framework
from knobtune.trainers.common.wire import Burst, Request

# these tests are about the servers a process starts itself (or read their pids)
pytestmark = pytest.mark.usefixtures("private_fork_servers")

ROOT = Path(__file__).resolve().parent.parent
BURST = Burst(train_samples=640, warmup_samples=64, windows=3)
CPU_CTX = {"hardware": {"cuda": False, "bf16": True, "usable_cores": 2}, "workload": {"batch_size": 32}}


def burst(framework: str = "pytorch", workload: str = "kt_test_workloads:tiny", timeout: float = 120,
          options: dict[str, Any] | None = None, **overrides: Any):
    knobs = {**for_framework(framework).defaults(CPU_CTX), **overrides}
    request = Request(workload=workload, workload_options=options or {}, knobs=knobs, burst=BURST)
    return run_child(framework, "burst", request, timeout)


def server_pids(framework: str) -> set[int]:
    return {s.proc.pid for k, s in forkserver._servers.items()
            if k[0] == framework and s.alive() and not isinstance(s, forkserver.SharedServer)}


def wait_for(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_forked_children_each_see_their_own_knobs():
    readings = []
    for threads in (1, 2, 0, 1):
        child = burst(intra_op_threads=threads, num_workers=1 if threads == 2 else 0)
        assert child.outcome == "ok", child.failure
        assert child.result.child_start == "forked"
        readings.append((child.result.applied["torch_threads"], child.result.loader["num_workers"]))
    # 0 is torch's own default, one thread per usable core: nothing of the earlier children leaks
    assert readings == [(1, 0), (2, 1), (len(os.sched_getaffinity(0)), 0), (1, 0)]
    assert len(server_pids("pytorch")) == 1


def test_a_crash_a_hang_or_a_nan_leaves_the_next_forked_child_unaffected():
    burst()  # the server is up
    servers = server_pids("pytorch")
    faults = [
        (dict(workload="kt_test_workloads:abort"), "crash", "SIGABRT"),
        (dict(workload="kt_test_workloads:sleepy", timeout=6, num_workers=2, persistent_workers=True), "timeout",
         "timeout_s=6"),
        (dict(workload="kt_test_workloads:diverge", options={"after": 3}), "nan", "non-finite"),
    ]
    for arguments, outcome, text in faults:
        failed = burst(**arguments)
        assert failed.outcome == outcome and text in failed.failure, (failed.outcome, failed.failure)
        assert group_members(failed.pgid) == []  # its DataLoader workers went with it
        after = burst()
        assert after.outcome == "ok" and after.result.child_start == "forked", after.failure
        assert after.result.val_accuracy is not None and after.result.applied["torch_threads"] > 0
    assert server_pids("pytorch") == servers  # one server saw all of it


def test_a_dead_server_takes_its_child_and_the_next_trial_gets_a_new_one():
    burst()
    (old,) = server_pids("pytorch")
    result: list[Any] = []
    runner = threading.Thread(target=lambda: result.append(burst(workload="kt_test_workloads:sleepy", timeout=60)))
    runner.start()
    wait_for(lambda: any(p.name() == "kt-burst" for p in psutil.Process(old).children()), 30, "the forked child")
    (child,) = [p.pid for p in psutil.Process(old).children() if p.name() == "kt-burst"]
    os.kill(old, signal.SIGKILL)
    runner.join(60)
    (lost,) = result
    assert lost.outcome == "crash" and "fork server" in lost.failure, lost.failure
    wait_for(lambda: not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE, 10,
             "the child to die with its server")
    after = burst()
    assert after.outcome == "ok" and after.result.child_start == "forked"
    assert server_pids("pytorch") and old not in server_pids("pytorch")


PARENT = """
import sys
sys.path.insert(0, {root!r})
from knobtune.search.launch.runner import run_child
from knobtune.spaces import for_framework
from knobtune.trainers.common.wire import Burst, Request
knobs = for_framework("pytorch").defaults({ctx!r})
run_child("pytorch", "burst", Request(workload="kt_test_workloads:sleepy", knobs=knobs, burst={burst!r}), 120)
"""


def test_a_killed_parent_leaves_neither_server_nor_child(tmp_path: Path):
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(PARENT.format(root=str(ROOT), ctx=CPU_CTX, burst=BURST)))
    parent = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path)
    try:
        def family() -> list[psutil.Process]:
            return psutil.Process(parent.pid).children(recursive=True)

        wait_for(lambda: any(p.name() == "kt-burst" for p in family()), 60, "the forked child")
        kin = family()
        assert any("knobtune.trainers.common.forkserver" in " ".join(p.cmdline()) for p in kin)
        parent.kill()
        parent.wait()
        wait_for(lambda: not [p for p in kin if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], 15,
                 "the server and its child to go")
    finally:
        if parent.poll() is None:
            parent.kill()


def test_the_switch_off_starts_fresh_processes(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(forkserver.ENV_SWITCH, "0")
    child = burst(intra_op_threads=1)
    assert child.outcome == "ok" and child.result.child_start == "fresh"
    assert child.result.applied["torch_threads"] == 1


@pytest.mark.tensorflow
def test_forked_tensorflow_children_each_see_their_own_threads():
    seen = []
    for threads in (1, 2):
        child = burst("tensorflow", "kt_tf_workloads:tiny", timeout=180, intra_op_threads=threads,
                      map_parallel_calls=2)
        assert child.outcome == "ok", child.failure
        assert child.result.child_start == "forked"
        seen.append(child.result.knobs_effective["intra_op_threads"])
    assert seen == [1, 2]


def test_a_shared_server_forks_for_other_processes_and_refuses_another_environment_or_affinity(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]):
    listener = forkserver.start_shared("pytorch", tmp_path)
    cores = sorted(os.sched_getaffinity(0))
    try:
        assert forkserver.wait_shared(listener) is None and (tmp_path / "pytorch.sock").exists()
        forkserver.shutdown()
        monkeypatch.setenv(forkserver.SHARED_DIR, str(tmp_path))
        result: list[Any] = []
        runner = threading.Thread(target=lambda: result.append(burst(workload="kt_test_workloads:sleepy",
                                                                     options={"seconds": 0.004})))
        runner.start()
        # the child is forked by the shared server (for this connection), not by a server of ours
        wait_for(lambda: any(p.name() == "kt-burst" for p in psutil.Process(listener.pid).children(recursive=True)),
                 60, "a child forked by the shared server")
        runner.join(120)
        (child,) = result
        assert child.outcome == "ok" and child.result.child_start == "forked", child.failure
        assert not server_pids("pytorch")  # no private server was started
        # another environment (an import may have read it) is refused
        other = forkserver.SharedServer("pytorch", str(tmp_path / "pytorch.sock"),
                                        {**os.environ, "PYTHONUNBUFFERED": "1", "KT_ANOTHER_SETTING": "1"})
        assert "KT_ANOTHER_SETTING" in (other.wait_ready() or "") and other.refused
        other.close()
        # so is another CPU affinity: a private server, started with it, serves the process
        forkserver.shutdown()
        os.sched_setaffinity(0, cores[:1])
        pinned = burst(intra_op_threads=0)
        assert pinned.outcome == "ok" and pinned.result.child_start == "forked", pinned.failure
        assert pinned.result.applied["torch_threads"] == 1  # torch's default: one thread per core it may use
        assert len(server_pids("pytorch")) == 1
        assert "shared pytorch server is not used" in capfd.readouterr().err
    finally:
        os.sched_setaffinity(0, cores)
        forkserver.shutdown()
        assert listener.stdin is not None
        listener.stdin.close()
        listener.wait(timeout=30)
    assert not (tmp_path / "pytorch.sock").exists()  # closing its stdin ends it
