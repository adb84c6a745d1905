"""Trial isolation: each burst (and each probe) is a child process in its own process group.

The parent writes the request as JSON, enforces the timeout, kills the whole process group
(DataLoader workers and tf.data threads included) however the child ends, and classifies the
outcome: ok, nan, oom, invalid (from the child's result), timeout, crash (non-zero exit or a
signal, with the tail of its output kept), oom (killed by SIGKILL that knobtune did not send:
the kernel's OOM killer).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from knobtune.search.launch import forkserver
from knobtune.search.launch.partition import Partition
from knobtune.trainers.common.errors import KILLED_UNASKED
from knobtune.trainers.common.wire import Request, Result

CHILD_OUTCOMES = ("ok", "nan", "oom", "invalid")
TAIL_LINES = 15
TAIL_CHARS = 2000
LAST_LINE_CHARS = 400  # of the output's last line, in a crash's one-line reason


class Cancelled(Exception):
    """The run was interrupted while this child ran; its process group is gone."""


@dataclass
class ChildResult:
    outcome: str  # ok | nan | oom | timeout | crash | invalid | error (the user's workload is at fault)
    result: Result = field(default_factory=Result)  # what the child wrote (empty when it wrote nothing)
    failure: str | None = None
    wall_seconds: float = 0.0
    returncode: int | None = None
    pgid: int | None = None
    output_tail: str = ""

    def reason(self) -> str:
        """The outcome and the first line of the failure: why it has no measurement, in one line."""
        return f"{self.outcome}: {self.failure.splitlines()[0] if self.failure else ''}"


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of the process group ``pgid``."""
    import psutil

    alive = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(proc.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            pass
    return alive


def kill_group(pgid: int, wait_s: float = 10.0) -> None:
    """SIGKILL every process left in the group and wait until the kernel has torn them down, so
    the next trial never shares the machine with the remains of this one."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        if not group_members(pgid) or time.monotonic() > deadline:
            return
        time.sleep(0.05)


def _libc() -> Any:
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True)
    except (OSError, AttributeError):
        return None


# Loaded here, in the parent: between fork and exec the child only calls it. (A dlopen there could
# wait forever on a loader lock another of the parent's threads held at the fork: --jobs forks
# children from several threads.)
_LIBC = _libc() if sys.platform == "linux" else None


def _die_with_parent() -> None:
    """In the child, before exec: get SIGKILL if the knobtune process dies (Linux), so a killed
    run leaves no trial running on; DataLoader workers already exit when their parent goes."""
    if _LIBC is not None:
        _LIBC.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _before_exec(placement: Partition | None) -> Callable[[], None] | None:
    """What the child does between fork and exec: die with its parent (Linux), and keep to its
    partition's cores."""
    if sys.platform != "linux":
        return None
    if placement is None:
        return _die_with_parent

    def prepare() -> None:
        _die_with_parent()
        placement.pin()

    return prepare


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-TAIL_LINES:])[-TAIL_CHARS:]


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def classify(returncode: int | None, timed_out: bool, result: Result, tail: str,
             timeout_s: float) -> tuple[str, str | None]:
    """Outcome and failure text of a finished child.

    A result the child wrote is its outcome, whatever happened after (a slow or crashing
    teardown, the timeout striking after the write): the measurement was complete."""
    if result.outcome in CHILD_OUTCOMES:
        return result.outcome, result.failure
    if result.error is not None:
        return "error", result.error
    if timed_out:
        return "timeout", f"no result within timeout_s={timeout_s:g} s; its process group was killed"
    if returncode is not None and returncode < 0:
        sig = -returncode
        if sig == signal.SIGKILL:
            return "oom", KILLED_UNASKED
        return "crash", _with_tail(f"killed by {_signal_name(sig)}", tail)
    return "crash", _with_tail(f"exited with status {returncode}" if returncode else "exited without a result", tail)


def _with_tail(reason: str, tail: str) -> str:
    """``reason``, then the output's last line on the same line (the one-line views show only the
    first: usually a Python exception's type and message) and the whole tail below it."""
    lines = tail.strip().splitlines()
    if not lines:
        return reason
    last = lines[-1].strip()
    return f"{reason}; last output: {last[:LAST_LINE_CHARS]}{'...' if len(last) > LAST_LINE_CHARS else ''}\n{tail}"


def _segments(path: Path) -> list[dict[str, Any]]:
    """The window segments a child has reported so far (complete lines only)."""
    try:
        text = path.read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines(keepends=True):
        if line.endswith("\n"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return out


def _start(framework: str, argv: list[str], env: dict[str, str], log_path: Path, placement: Partition | None,
           server: forkserver.Server | None) -> subprocess.Popen[bytes] | forkserver.ForkedChild:
    """The child, forked from ``server`` (warm) or as a fresh ``python -m knobtune.trainers.<framework>``."""
    if server is not None:
        try:
            return server.start(argv, env, os.getcwd(), log_path)
        except forkserver.ServerLost:
            forkserver.discard(server)  # its busy lock goes with it
    with open(log_path, "wb") as log:
        return subprocess.Popen([sys.executable, "-m", f"knobtune.trainers.{framework}", *argv], stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env,
                                preexec_fn=_before_exec(placement))


def run_child(
    framework: str,
    command: str,
    request: Request,
    timeout_s: float,
    tick: Callable[[float], None] | None = None,
    poll_s: float = 0.25,
    watch: Callable[[list[dict[str, Any]]], str | None] | None = None,
    keep: Path | None = None,
    placement: Partition | None = None,
    cancel: threading.Event | None = None,
) -> ChildResult:
    """Run ``python -m knobtune.trainers.<framework> <command>`` on ``request`` and classify the result.

    ``tick(elapsed_seconds)`` is called while waiting (for progress display). ``watch(segments)``
    sees the windows measured so far; when it returns a reason the child's group is killed and the
    outcome is ``pruned`` (the segments are kept in ``data``). On KeyboardInterrupt the child's
    group is killed before the interrupt propagates. ``keep`` (a directory) receives the child's
    whole output (``output.log``) and the request it ran (``request.json``). ``placement`` pins the
    child to a partition of the machine (its cores and GPU) before it starts. When ``cancel`` is set
    (another thread saw Ctrl-C), the child's group is killed and ``Cancelled`` raised.
    """
    with tempfile.TemporaryDirectory(prefix="knobtune-trial-") as tmp:
        tmp_path = Path(tmp)
        request_path, result_path, log_path = tmp_path / "request.json", tmp_path / "result.json", tmp_path / "output.log"
        progress_path = tmp_path / "progress.jsonl"
        request_path.write_text(json.dumps(replace(request, progress_path=str(progress_path)).to_json()))
        env = forkserver.child_environment()
        if placement is not None:
            env = placement.env(env)
        argv = [command, "--request", str(request_path), "--result", str(result_path)]
        start = time.monotonic()
        server = forkserver.acquire(framework, env, placement)
        proc = _start(framework, argv, env, log_path, placement, server)
        timed_out, pruned, seen = False, None, 0
        try:
            while True:
                try:
                    proc.wait(timeout=poll_s)
                    break
                except subprocess.TimeoutExpired:
                    elapsed = time.monotonic() - start
                    if elapsed > timeout_s:
                        timed_out = True
                        kill_group(proc.pid)
                        proc.wait()
                        break
                    if cancel is not None and cancel.is_set():
                        kill_group(proc.pid)
                        proc.wait()
                        raise Cancelled(f"cancelled after {elapsed:.1f} s")
                    if tick:
                        tick(elapsed)
                    if watch:
                        segments = _segments(progress_path)
                        if len(segments) > seen:
                            seen = len(segments)
                            pruned = watch(segments)
                            if pruned:
                                kill_group(proc.pid)
                                proc.wait()
                                break
        except BaseException:
            kill_group(proc.pid)
            proc.wait()
            raise
        finally:
            kill_group(proc.pid)  # whatever the child left behind (workers) goes with it
            if server is not None:
                server.busy.release()
                if getattr(proc, "lost", False):
                    forkserver.discard(server)
        wall = time.monotonic() - start
        if keep is not None:
            shutil.copyfile(log_path, keep / "output.log")
            (keep / "request.json").write_text(json.dumps(request.to_json(), indent=2, sort_keys=True) + "\n")
        result = Result()
        if result_path.exists():
            try:
                result = Result.from_json(json.loads(result_path.read_text()))
            except ValueError:  # not JSON (a torn write), or not an object: no result
                result = Result()
        tail = _tail(log_path)
        if pruned:
            return ChildResult("pruned", Result(segments=_segments(progress_path)), pruned, wall, proc.returncode,
                               proc.pid, tail)
        outcome, failure = classify(proc.returncode, timed_out, result, tail, timeout_s)
        return ChildResult(outcome, result, failure, wall, proc.returncode, proc.pid, tail)
