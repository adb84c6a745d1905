"""A trial as a group of ranks (knobtune.trainers.pytorch.group, issue 20's launcher): real forked
ranks over gloo, started as torchrun starts them, ending as one job (tests/workloads/kt_group_script.py)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import WORKLOADS, at_once

SCRIPT = WORKLOADS / "kt_group_script.py"


def group(scenario: str, out: Path, nproc: int = 2, grace_s: float = 600.0) -> tuple[dict, str]:
    """The launcher's GroupEnd, and its stderr (the ranks' tracebacks). A group that failed to end
    as one job hangs, and the timeout fails the test (the grace is long unless the test is about it)."""
    proc = subprocess.run([sys.executable, str(SCRIPT), scenario, str(nproc), str(grace_s), str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_ranks_get_torchruns_environment_and_groups_side_by_side_never_share_a_port(tmp_path: Path):
    (first, _), (second, _) = at_once(lambda: group("allreduce", tmp_path / "a"),
                                      lambda: group("allreduce", tmp_path / "b", nproc=3))
    assert first["ok"] and second["ok"] and first["reason"] is None
    assert [r["status"] for r in first["ranks"]] == [0, 0] and [r["status"] for r in second["ranks"]] == [0, 0, 0]
    assert first["port"] != second["port"]  # each launcher's store took a port the system chose
    for folder, nproc, end in ((tmp_path / "a", 2, first), (tmp_path / "b", 3, second)):
        for rank in range(nproc):
            seen = json.loads((folder / f"rank{rank}.json").read_text())
            assert seen["sum"] == sum(range(1, nproc + 1))  # the all_reduce crossed every rank
            assert seen["env"] == {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc),
                                   "MASTER_PORT": str(end["port"])}


def test_a_crashing_rank_ends_the_group_and_is_named(tmp_path: Path):
    end, stderr = group("crash", tmp_path, nproc=3)
    assert not end["ok"] and end["failed"]["rank"] == 1 and end["failed"]["status"] == 1
    assert end["reason"] == "rank 1 of 3 exited with status 1; the other ranks were stopped with it"
    assert "RuntimeError: rank 1 breaks" in stderr
    assert all(r["status"] != 0 for r in end["ranks"])  # none of the others went on


def test_ranks_that_disagree_are_said_so_in_a_collective_or_outside_one(tmp_path: Path):
    # rank 1 leaves while rank 0 waits in a barrier: gloo raises in rank 0 when its peer goes
    end, _ = group("disagree", tmp_path / "collective")
    assert end["failed"]["rank"] == 0 and "the ranks disagree: rank(s) 1 finished while rank 0" in end["reason"]
    # rank 1 leaves while rank 0 is busy outside any collective: stopped after the grace
    end, _ = group("straggle", tmp_path / "busy", grace_s=1.0)
    assert end["failed"] is None and end["stragglers"] == [0]
    assert end["ranks"][0]["status"] == -signal.SIGKILL and end["ranks"][1]["status"] == 0
    assert end["reason"].startswith("the ranks disagree: rank(s) 1 finished while rank(s) 0 were still running")


def test_ranks_die_with_their_launcher(tmp_path: Path):
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "hang", "2", "600", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        pids = []
        for _ in range(600):  # until both ranks have started (each writes its pid first)
            if all((tmp_path / f"rank{r}.pid").exists() for r in (0, 1)):
                pids = [int((tmp_path / f"rank{r}.pid").read_text()) for r in (0, 1)]
                break
            time.sleep(0.1)
        assert pids, "the ranks never started"
        os.kill(proc.pid, signal.SIGKILL)  # the launcher dies without a word
        proc.wait(timeout=30)
        for _ in range(300):
            if not any(_alive(pid) for pid in pids):
                break
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in pids), "a rank outlived its launcher"
    finally:
        proc.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False
