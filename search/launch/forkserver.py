"""The parent's side of the warm start: trial children forked from a server that has imported the
framework once (trainers/common/forkserver.py), instead of a fresh interpreter per trial.

One server per framework, partition and environment: it starts with the environment and the
CPU affinity its children would have had, so a child differs from a fresh process only in not
paying the imports. A server serves one child at a time; a request that finds its server busy,
or a server that cannot start, runs as a fresh process (the server's failure is said once).
``KNOBTUNE_FORK_SERVER=0`` turns the warm start off.

Shared servers: with ``KNOBTUNE_FORK_SERVER_DIR`` naming a folder where ``FRAMEWORK.sock`` sockets
of listening servers are (``start_shared``), a process whose children need no partition connects
to the framework's shared server instead of starting its own: the imports are paid once for every
knobtune process on the machine (the test suite's session does this). The shared server forks a
process for the connection that serves it as a private server would; it refuses a process whose
environment or CPU affinity differs from its own (then a private server starts).
"""
from __future__ import annotations

import atexit
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from knobtune.search.launch.partition import Partition

ENV_SWITCH = "KNOBTUNE_FORK_SERVER"
SHARED_DIR = "KNOBTUNE_FORK_SERVER_DIR"
READY_TIMEOUT_S = 300.0
SHARED_READY_TIMEOUT_S = 30.0
# Frameworks whose children may be forked from a server (see the module docstring of
# trainers/common/forkserver.py for what the server must not have started).
FORKABLE = ("pytorch", "tensorflow")


class ServerLost(Exception):
    """The server's pipe closed or said something unexpected."""


def enabled(framework: str, environ: dict[str, str] | None = None) -> bool:
    """Whether ``framework``'s children come from a warm server here."""
    env = os.environ if environ is None else environ
    if env.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    return framework in FORKABLE and hasattr(os, "fork") and sys.platform == "linux"


class _Lines:
    """Lines from a pipe, read with a timeout."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buffer = fd, b""

    def read(self, timeout: float | None) -> dict[str, Any] | None:
        """The next message, or None when ``timeout`` passed first; ServerLost at end of file."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(self.fd, 65536)
            if not chunk:
                raise ServerLost("the fork server's pipe closed")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            raise ServerLost(f"the fork server said {line[:200]!r}, expected a JSON line") from None
        if not isinstance(message, dict):
            raise ServerLost(f"the fork server said {message!r}, expected an object")
        return message


def _verdict(message: dict[str, Any] | None, timeout: float) -> str | None:
    """None when a server's first message says it is ready, else why it is not."""
    if message is None:
        return f"not ready after {timeout:g} s"
    return None if message.get("ready") else str(message.get("error") or message)


def child_environment() -> dict[str, str]:
    """The environment of a child started from this process (and so of the server it is forked
    from: a shared server serves only that one)."""
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


class Server:
    """One running fork server."""

    def __init__(self, framework: str, env: dict[str, str], placement: Partition | None) -> None:
        self.framework = framework
        self.busy = threading.Lock()
        self._stderr = tempfile.TemporaryFile(prefix="knobtune-forkserver-")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "knobtune.trainers.common.forkserver", framework],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=env,
            start_new_session=True,  # Ctrl-C in the terminal is the parent's to handle, as for a child
            preexec_fn=placement.pin if placement is not None and sys.platform == "linux" else None)
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self.lines = _Lines(self.proc.stdout.fileno())
        self.info: dict[str, Any] = {}

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> str | None:
        """None once the server has imported the framework, else why it is not usable."""
        try:
            message = self.lines.read(timeout)
        except ServerLost as exc:
            return f"{exc}; {self.stderr_tail() or 'no output'}"
        problem = _verdict(message, timeout)
        if problem is None:
            self.info = message  # type: ignore[assignment]
        return problem

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()

    def start(self, argv: list[str], env: dict[str, str], cwd: str, log: Path) -> "ForkedChild":
        """Fork a child running ``python -m knobtune.trainers.<framework> ARGV`` (ServerLost if the server
        is gone)."""
        request = {"argv": argv, "env": env, "cwd": cwd, "log": str(log)}
        try:
            self._send(request)
            message = self.lines.read(60.0)
        except (BrokenPipeError, OSError) as exc:
            raise ServerLost(f"the fork server is gone ({exc})") from None
        if message is None or "pid" not in message:
            raise ServerLost(f"the fork server answered {message!r}, expected the child's pid")
        return ForkedChild(self, int(message["pid"]), log)

    def stderr_tail(self, chars: int = 1000) -> str:
        try:
            self._stderr.seek(0)
            return self._stderr.read().decode(errors="replace").strip()[-chars:]
        except (OSError, ValueError):
            return ""

    def close(self, wait_s: float = 5.0) -> None:
        """End the server (it kills a child still running)."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdout, self._stderr):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass


class SharedServer(Server):
    """A connection to a shared server (``start_shared``): the process it forked for this
    connection serves it as a private server would."""

    def __init__(self, framework: str, path: str, env: dict[str, str]) -> None:  # noqa: D107 (no super: no process)
        self.framework, self.path = framework, path
        self.busy = threading.Lock()
        self.info: dict[str, Any] = {}
        self.refused = False
        self._closed = False
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.connect(path)
            self._send({"hello": {"env": env, "cores": sorted(os.sched_getaffinity(0))}})
        except OSError:
            self.sock.close()
            raise
        self.lines = _Lines(self.sock.fileno())

    def wait_ready(self, timeout: float = SHARED_READY_TIMEOUT_S) -> str | None:
        problem = super().wait_ready(timeout)
        if problem is None and not self.info.get("shared"):
            problem = f"{self.path} answered {self.info!r}, expected a shared server"
        self.refused = problem is not None
        return problem

    def alive(self) -> bool:
        return not self._closed

    def _send(self, message: dict[str, Any]) -> None:
        self.sock.sendall((json.dumps(message) + "\n").encode())

    def stderr_tail(self, chars: int = 1000) -> str:
        return ""  # (the shared server's output goes where whoever started it sent it)

    def close(self, wait_s: float = 5.0) -> None:
        self._closed = True
        try:
            self.sock.close()
        except OSError:
            pass


def shared_socket(framework: str, env: dict[str, str]) -> str | None:
    """The socket of ``framework``'s shared server, when ``KNOBTUNE_FORK_SERVER_DIR`` names one."""
    folder = env.get(SHARED_DIR, "").strip()
    if not folder:
        return None
    path = Path(folder) / f"{framework}.sock"
    return str(path) if path.exists() else None


def start_shared(framework: str, folder: Path, env: dict[str, str] | None = None,
                 stderr: Any = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
    """Start ``framework``'s shared server on ``folder/FRAMEWORK.sock``, in the environment its
    clients' children will have (default: this process's, as ``run_child`` gives its children).
    It ends when the returned process's stdin is closed; ``wait_shared`` waits until it listens."""
    env = child_environment() if env is None else env
    return subprocess.Popen(
        [sys.executable, "-m", "knobtune.trainers.common.forkserver", framework, "--listen",
         str(Path(folder) / f"{framework}.sock")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, env=env, start_new_session=True)


def wait_shared(proc: subprocess.Popen[bytes], timeout: float = READY_TIMEOUT_S) -> str | None:
    """None once a ``start_shared`` server listens, else why it does not."""
    assert proc.stdout is not None
    try:
        return _verdict(_Lines(proc.stdout.fileno()).read(timeout), timeout)
    except ServerLost as exc:
        return str(exc)


class ForkedChild:
    """A child forked by a server, waited on like a ``subprocess.Popen``: ``pid`` (its process
    group too), ``wait(timeout)``, ``returncode``."""

    def __init__(self, server: Server, pid: int, log: Path) -> None:
        self.server, self.pid, self.log = server, pid, log
        self.returncode: int | None = None
        self.lost = False
        self._ended = False

    def wait(self, timeout: float | None = None) -> int | None:
        if self._ended:
            return self.returncode
        try:
            message = self.server.lines.read(timeout)
        except ServerLost as exc:
            return self._lost(exc)
        if message is None:
            raise subprocess.TimeoutExpired(f"forked child {self.pid}", timeout or 0.0)
        if "exit" not in message:
            return self._lost(ServerLost(f"the fork server said {message!r}, expected the child's exit status"))
        self.returncode, self._ended = int(message["exit"]), True
        return self.returncode

    def _lost(self, exc: ServerLost) -> None:
        """The server is gone or confused: the child went with it (SIGKILL on the server's death);
        say so where the outcome's tail is read."""
        with open(self.log, "a") as log:
            log.write(f"\nknobtune: {exc} while this child ran; {self.server.stderr_tail(300)}\n")
        self.lost, self._ended = True, True
        return None

    def poll(self) -> int | None:
        try:
            return self.wait(0)
        except subprocess.TimeoutExpired:
            return None


_servers: dict[tuple[Any, ...], Server] = {}
_failed: dict[str, str] = {}
_refused: set[tuple[Any, ...]] = set()  # environments a shared server refused: served privately
_starting: dict[tuple[Any, ...], threading.Lock] = {}
_lock = threading.Lock()


def _key(framework: str, env: dict[str, str], placement: Partition | None) -> tuple[Any, ...]:
    cores = tuple(placement.cores) if placement is not None else None
    return framework, cores, tuple(sorted((k, v) for k, v in env.items() if k != ENV_SWITCH))


def acquire(framework: str, env: dict[str, str], placement: Partition | None) -> Server | None:
    """A ready, idle server for these children (its ``busy`` lock held: release it), or None
    when they should start as fresh processes."""
    if not enabled(framework, env):
        return None
    key = _key(framework, env, placement)
    with _lock:
        starting = _starting.setdefault(key, threading.Lock())
    with starting:  # one server per key; other keys' servers start meanwhile
        with _lock:
            if framework in _failed:
                return None
            server = _servers.get(key)
        if server is not None and not server.alive():
            discard(server)
            server = None
        if server is None and placement is None:
            server = _connect_shared(framework, env, key)
            if server is not None:
                with _lock:
                    _servers[key] = server
        if server is None:
            server = Server(framework, env, placement)
            problem = server.wait_ready()
            if problem is not None:
                server.close()
                with _lock:
                    _failed[framework] = problem
                print(f"knobtune: no warm start for {framework} trials ({problem}); each trial starts a fresh "
                      f"process", file=sys.stderr, flush=True)
                return None
            with _lock:
                _servers[key] = server
                stale = [k for k, other in _servers.items() if k[:2] == key[:2] and k != key]
            for old in stale:  # the environment changed since: its server will not be asked again
                _close_if_idle(old)
    return server if server.busy.acquire(blocking=False) else None


def _connect_shared(framework: str, env: dict[str, str], key: tuple[Any, ...]) -> Server | None:
    """A ready connection to ``framework``'s shared server, or None (none, or it refused: said once)."""
    path = shared_socket(framework, env)
    if path is None or key in _refused:
        return None
    try:
        server = SharedServer(framework, path, env)
    except OSError as exc:  # a server that has gone, leaving its socket file
        problem: str | None = f"cannot connect to {path} ({exc.strerror or exc})"
    else:
        problem = server.wait_ready()
        if problem is None:
            return server
        server.close()
    with _lock:
        first = framework not in {k[0] for k in _refused}
        _refused.add(key)
    if first:
        print(f"knobtune: the shared {framework} server is not used ({problem}); this run starts its own",
              file=sys.stderr, flush=True)
    return None


def _close_if_idle(key: tuple[Any, ...]) -> None:
    with _lock:
        server = _servers.get(key)
        if server is None or not server.busy.acquire(blocking=False):
            return
        del _servers[key]
    server.close(wait_s=1.0)


def discard(server: Server) -> None:
    """Forget a server that misbehaved (the next request starts a new one)."""
    with _lock:
        for key, known in list(_servers.items()):
            if known is server:
                del _servers[key]
    server.close(wait_s=1.0)


def shutdown() -> None:
    """End every server this process started."""
    with _lock:
        servers = list(_servers.values())
        _servers.clear()
    for server in servers:
        server.close()


atexit.register(shutdown)
