"""The warm start for trial children: ``python -m knobtune.trainers.common.forkserver FRAMEWORK``.

A long-lived server imports the framework and every module a trial imports, once, then forks a
fresh child per request. It initialises nothing that cannot survive a fork: no tensor is made, no
CUDA context, no OpenMP or intra-op thread pool, no TensorFlow runtime (importing TensorFlow
starts none; the only threads an import leaves are OpenBLAS's idle servers, which OpenBLAS
re-creates after a fork). A child then starts the way a fresh ``python -m knobtune.trainers.FRAMEWORK``
process would: its own session and process group, SIGKILL when the server dies, stdin from
/dev/null, stdout and stderr into its log, the request's environment and working directory,
fresh random seeds, and the same ``trainers.common.child.main``.

Protocol, one JSON object per line. The server says ``{"ready": ..., "threads": N}`` once its
imports are done. Each request ``{"argv", "env", "cwd", "log"}`` on stdin is answered with
``{"pid": P}`` when the child runs and ``{"exit": S}`` (the exit code, or minus the signal) when it
has ended. The server serves one child at a time. When stdin closes (the parent ended, however
it ended) the server kills the child's process group and exits.

Shared (``FRAMEWORK --listen SOCKET``): one warm server for every knobtune process of the
machine, as a test session or a box running many short studies wants. It listens on a Unix
socket and forks a process per connection, which speaks the protocol above over the socket after a
handshake: ``{"hello": {"env": ...}}`` is answered ``{"ready": true}``, or ``{"ready": false,
"refused": true}`` when the client's environment differs from the server's (in anything but
``IGNORED``, which no import reads), or its CPU affinity from the server's (an import may have read either:
OpenMP sizes its thread pool from the affinity). The client then starts a private server.
"""
from __future__ import annotations

import importlib
import json
import os
import random
import select
import signal
import socket
import sys
import time
import traceback
from typing import Any, Callable

PR_SET_PDEATHSIG = 1


PR_SET_NAME = 15


def _libc() -> Any:
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True)
    except (OSError, AttributeError):
        return None


_LIBC = _libc()  # loaded before any fork: the child only calls it


def _prctl(option: int, value: Any) -> None:
    if _LIBC is not None:
        _LIBC.prctl(option, value)


def warm(framework: str) -> dict[str, Any]:
    """Import what every trial of ``framework`` imports (nothing runs); returns the trainer's
    ``__main__`` module. An old or broken framework is left for the child to report."""
    entry = importlib.import_module(f"knobtune.trainers.{framework}.__main__")
    from knobtune.trainers.common import versions

    if versions.check(framework) is None:
        entry.handlers()
        if framework == "pytorch":
            # torch.optim imports dynamo on an optimizer's first use: most of a second per trial
            importlib.import_module("torch._dynamo")
    return {"entry": entry}


def unsafe_to_fork(framework: str) -> str | None:
    """Why this server must not fork (its imports started what a fork cannot carry), or None."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "an import initialised CUDA"
    context = sys.modules.get("tensorflow.python.eager.context")
    if context is not None:
        current = context.context_safe()
        if current is not None and current._initialized:
            return "an import initialised TensorFlow's runtime"
    return None


def thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def _reseed() -> None:
    """What a fresh interpreter would have: Python's and NumPy's global generators seeded from
    the OS (torch's default generator has a fixed seed, which the server never consumed)."""
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _become_child(framework: str, state: dict[str, Any], request: dict[str, Any], server_pid: int) -> None:
    """In the forked child: set up as a fresh process would be, run the command, never return."""
    code = 1
    try:
        os.setsid()
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        # its name in ps and top (the command line stays the server's): kt-burst, kt-probe, ...
        _prctl(PR_SET_NAME, f"kt-{request['argv'][0]}"[:15].encode())
        if os.getppid() != server_pid:  # the server died between fork and prctl
            os._exit(1)
        devnull = os.open(os.devnull, os.O_RDONLY)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(devnull)
        os.close(log)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for name, value in state["imports_set"].items():
            os.environ.setdefault(name, value)
        sys.path[0] = request["cwd"]
        sys.argv = [f"knobtune.trainers.{framework}", *request["argv"]]
        _reseed()
        from knobtune.trainers.common import child

        child.STARTED = "forked"
        entry = state["entry"]
        child.main(framework, entry.COMMANDS, entry.handlers, list(request["argv"]))
    except SystemExit as exc:  # argparse
        code = exc.code if isinstance(exc.code, int) else 2
    except BaseException:  # noqa: BLE001 - a crash is the child's outcome, as in a fresh process
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _say(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _wait(pid: int, stdin_fd: int) -> int | None:
    """The child's exit code (minus the signal), or None when the parent went away first."""
    try:
        pidfd: int | None = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    try:
        while True:
            watched = [stdin_fd] + ([pidfd] if pidfd is not None else [])
            ready, _, _ = select.select(watched, [], [], 0.05 if pidfd is None else None)
            if stdin_fd in ready and not os.read(stdin_fd, 1):
                return None
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _warm_up(framework: str) -> dict[str, Any]:
    """The server's state once its imports are done; RuntimeError when forking would be unsafe."""
    before = dict(os.environ)
    state = warm(framework)
    # what the imports set for themselves (TF_CPP_MIN_LOG_LEVEL): a fresh child's imports would too
    state["imports_set"] = {k: v for k, v in os.environ.items() if before.get(k) != v}
    state["environ"] = before
    state["cores"] = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    problem = unsafe_to_fork(framework)
    if problem:
        raise RuntimeError(f"{problem}: forking children from it would be unsafe")
    return state


def _line(fd: int, buffer: bytes) -> tuple[bytes | None, bytes]:
    """The next line from ``fd`` after what ``buffer`` holds (None at end of file), and the rest read."""
    while b"\n" not in buffer:
        chunk = os.read(fd, 65536)
        if not chunk:
            return None, buffer
        buffer += chunk
    line, rest = buffer.split(b"\n", 1)
    return line, rest


def _serve(framework: str, state: dict[str, Any], in_fd: int, say: Callable[[dict[str, Any]], None]) -> int:
    """Fork a child per request read from ``in_fd``, one at a time, until ``in_fd`` closes."""
    buffer = b""
    while True:
        line, buffer = _line(in_fd, buffer)
        if line is None:
            return 0
        if buffer:  # one request at a time: anything more is a protocol error
            say({"error": "a second request arrived while one was pending"})
            return 1
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        server_pid = os.getpid()
        pid = os.fork()
        if pid == 0:
            _become_child(framework, state, request, server_pid)
        say({"pid": pid})
        code = _wait(pid, in_fd)
        if code is None:
            _kill_group(pid)
            os.waitpid(pid, 0)
            return 0
        say({"exit": code})


def _warmed(framework: str) -> tuple[dict[str, Any] | None, float]:
    """``_warm_up``'s state and its seconds; None (said on stdout) when the server cannot serve."""
    start = time.monotonic()
    try:
        return _warm_up(framework), round(time.monotonic() - start, 3)
    except Exception as exc:  # noqa: BLE001 - the parent falls back to a fresh process per trial
        _say({"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        return None, 0.0


def serve(framework: str) -> int:
    """The private server: requests on stdin, answers on stdout, for the one process that started it."""
    state, seconds = _warmed(framework)
    if state is None:
        return 1
    _say({"ready": True, "threads": thread_count(), "import_seconds": seconds})
    return _serve(framework, state, sys.stdin.fileno(), _say)


# Variables no import reads: knobtune's own (a child reads them when it runs), a test runner's
# current test, the terminal's size and the shell's bookkeeping. Any other difference is refused.
IGNORED_PREFIXES = ("KNOBTUNE_", "PYTEST_")
IGNORED = frozenset({"COLUMNS", "LINES", "PWD", "OLDPWD", "SHLVL", "_"})


def environment_differences(mine: dict[str, str], theirs: dict[str, str]) -> list[str]:
    """The variables (names only) that may make a child of this server differ from a fresh
    process started in ``theirs``."""
    keys = {k for k in mine.keys() | theirs.keys() if k not in IGNORED and not k.startswith(IGNORED_PREFIXES)}
    return sorted(k for k in keys if mine.get(k) != theirs.get(k))


def _refusal(state: dict[str, Any], hello: dict[str, Any]) -> str | None:
    """Why this server must not serve the client that said ``hello``, or None."""
    differs = environment_differences(state["environ"], hello.get("env") or {})
    if differs:
        return f"this server was started in another environment (it differs in {', '.join(differs[:8])})"
    cores = hello.get("cores")
    if cores is not None and sorted(cores) != state["cores"]:  # OpenMP sized its pool from it on import
        return f"this server may use cores {state['cores']}, the client {sorted(cores)}"
    return None


def _connection(framework: str, state: dict[str, Any], conn: socket.socket) -> int:
    """In a process forked per connection: the handshake, then the private server's protocol."""
    fd = conn.fileno()

    def say(message: dict[str, Any]) -> None:
        conn.sendall((json.dumps(message) + "\n").encode())

    line, rest = _line(fd, b"")
    if line is None:
        return 0
    if rest:
        say({"error": "a request arrived before the server was ready"})
        return 1
    problem = _refusal(state, json.loads(line).get("hello") or {})
    if problem:
        print(f"knobtune shared server: refused a client: {problem}", file=sys.stderr, flush=True)
        say({"ready": False, "refused": True, "error": problem})
        return 0
    say({"ready": True, "threads": thread_count(), "shared": True})
    return _serve(framework, state, fd, say)


def listen(framework: str, path: str) -> int:
    """The shared server: warm once, then serve every knobtune process of this machine that
    connects to the Unix socket ``path`` and has the same environment, each connection in a
    process forked for it (so each gets the private server's protocol and isolation). Says
    ``{"ready": ...}`` on stdout once listening; ends when its stdin closes."""
    state, seconds = _warmed(framework)
    if state is None:
        return 1
    if os.path.exists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    _say({"ready": True, "listening": path, "import_seconds": seconds})
    stdin_fd = sys.stdin.fileno()
    try:
        while True:
            ready, _, _ = select.select([listener, stdin_fd], [], [], 1.0)
            while True:  # reap the connections' processes that have ended
                try:
                    done, _ = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if not done:
                    break
            if stdin_fd in ready and not os.read(stdin_fd, 1):
                return 0
            if listener not in ready:
                continue
            conn, _ = listener.accept()
            sys.stdout.flush()
            sys.stderr.flush()
            if os.fork() == 0:
                code = 1
                try:
                    listener.close()
                    os.close(stdin_fd)
                    code = _connection(framework, state, conn)
                except BaseException:  # noqa: BLE001 - this connection's client sees it closed
                    traceback.print_exc()
                finally:
                    os._exit(code)
            conn.close()
    finally:
        listener.close()
        try:
            os.unlink(path)
        except OSError:
            pass


USAGE = "usage: python -m knobtune.trainers.common.forkserver FRAMEWORK [--listen SOCKET]"


def _end(code: int) -> None:
    """Exit without the interpreter's teardown: with a framework imported it takes 0.6 s (torch) to
    1 s (TensorFlow), which the process that started the server waits for as it ends. The server
    has nothing to finalise: its children are its own processes, its output is flushed here."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    if len(sys.argv) == 2:
        _end(serve(sys.argv[1]))
    if len(sys.argv) == 4 and sys.argv[2] == "--listen":
        _end(listen(sys.argv[1], sys.argv[3]))
    sys.exit(f"{USAGE} (got {sys.argv[1:]})")
