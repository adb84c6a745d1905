"""Shared helpers: the data cache, running the real CLI, writing study files."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, TypeVar

import pytest

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = Path(__file__).resolve().parent / "workloads"


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


CUDA_ANSWER = "KNOBTUNE_TESTS_TORCH_CUDA"  # the session's answer, inherited by pytest-xdist's workers


def torch_cuda() -> bool:
    """Whether torch sees a CUDA device, asked in a child: this process imports no framework
    (torch and tensorflow never share a process, the tests' own included). Asked once a session:
    the answer is kept in the environment, which the workers started after it inherit."""
    if CUDA_ANSWER not in os.environ:
        answer = False
        if _installed("torch"):
            probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                                   capture_output=True, text=True, timeout=120)
            answer = probe.stdout.strip() == "True"
        os.environ[CUDA_ANSWER] = "1" if answer else "0"
    return os.environ[CUDA_ANSWER] == "1"


def pytest_configure(config: pytest.Config) -> None:
    torch_cuda()  # (in the controller, before pytest-xdist starts its workers)


HAVE_TENSORFLOW = _installed("tensorflow")


# each test that uses a module-scoped fixture runs in its module's pytest-xdist group (xdist_groups.py)
pytest_plugins = ["xdist_groups"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any("cuda" in item.keywords for item in items) and not torch_cuda():
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in items:
            if "cuda" in item.keywords:
                item.add_marker(skip)
    if not HAVE_TENSORFLOW:
        skip = pytest.mark.skip(reason="tensorflow is not installed (pip install 'knobtune[tensorflow]')")
        for item in items:
            if "tensorflow" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def data_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One data cache for the session (the digits PNGs are written once), seen by every child."""
    cache = tmp_path_factory.mktemp("cache")
    os.environ["KNOBTUNE_CACHE_DIR"] = str(cache)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(WORKLOADS), os.environ.get("PYTHONPATH")]))
    os.environ.pop("KNOBTUNE_STORAGE", None)
    if str(WORKLOADS) not in sys.path:
        sys.path.insert(0, str(WORKLOADS))
    return cache


@pytest.fixture(scope="session", autouse=True)
def shared_fork_servers(data_cache: Path, tmp_path_factory: pytest.TempPathFactory):
    """One warm server per framework for the session, shared by every knobtune process a test
    starts (the product's shared mode, KNOBTUNE_FORK_SERVER_DIR): their children are forked from
    it instead of each run importing the framework again. Tests about a run's own servers and
    children use ``private_fork_servers``."""
    import sklearn  # noqa: F401 - see below

    from knobtune.search.launch import forkserver

    # The servers refuse a process whose environment differs from theirs. scikit-learn sets KMP_*
    # variables for itself when imported, and tests import it in this process (optuna-dashboard
    # does): imported first, this process's environment, which every run inherits, stays theirs.
    folder = tmp_path_factory.mktemp("forkservers")
    frameworks = ["pytorch"] * _installed("torch") + ["tensorflow"] * HAVE_TENSORFLOW
    with open(folder / "servers.log", "ab") as log:
        started = [forkserver.start_shared(framework, folder, stderr=log) for framework in frameworks]
    for framework, proc in zip(frameworks, started):
        problem = forkserver.wait_shared(proc)
        if problem:  # the tests still pass, each run starting its own server: slower
            print(f"\nno shared {framework} server for this session: {problem}", file=sys.stderr)
    os.environ[forkserver.SHARED_DIR] = str(folder)
    yield folder
    os.environ.pop(forkserver.SHARED_DIR, None)
    for proc in started:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture
def private_fork_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    """No shared server: each knobtune process starts its own, so its trial children are its own
    descendants (the tests of process groups, Ctrl-C and killed runs look for them there)."""
    from knobtune.search.launch import forkserver

    monkeypatch.delenv(forkserver.SHARED_DIR, raising=False)


def knobtune(*args: str, cwd: Path, timeout: float = 600, check: int | None = None) -> subprocess.CompletedProcess:
    """Run the real ``knobtune`` CLI in a fresh process."""
    proc = subprocess.run(
        [sys.executable, "-m", "knobtune", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    if check is not None:
        assert proc.returncode == check, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def study_file(directory: Path, body: str, name: str = "study.toml") -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(body))
    return path


# `knobtune run` flags for tests that are not about confirmation or diagnosis (they cost a minute each)
FAST = ("--no-confirm", "--no-diagnose")

# (one baseline run: the guard's several runs have their own test, and each costs a burst)
TINY_BURST = """
[burst]
train_samples = 640
warmup_samples = 64
windows = 3
timeout_s = 120
[guard]
baseline_runs = 1
"""


def run_script(script: Path, *args: str, config: Path | None = None, cwd: Path,
               extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """A user's training script in production: a plain ``python script.py``, as a user runs it,
    with the export at ``config`` as $KNOBTUNE_CONFIG (none: the script's own settings)."""
    env = {k: v for k, v in os.environ.items() if k != "KNOBTUNE_CONFIG"}
    if config is not None:
        env["KNOBTUNE_CONFIG"] = str(config)
    env.update(extra_env or {})
    return subprocess.run([sys.executable, str(script), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def at_once(*calls: Callable[[], T]) -> list[T]:
    """Each call (a child process to run and wait for, as a rule) on its own thread, all at once:
    independent scripts whose start-up is mostly importing a framework need not wait for each
    other. Their results, in order."""
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return [f.result() for f in [pool.submit(call) for call in calls]]


def exported_and_run(directory: Path, study: str, script: Path, *args: str
                     ) -> tuple[dict, subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """The study's winner exported to ``best.json``; then, at once, its ``--format snippet`` and the
    script run in production with it (the watchdog judging every 0.05 s). The export, the
    snippet's process and the production run's."""
    knobtune("export", study, "-o", "best.json", cwd=directory, check=0)
    best = json.loads((directory / "best.json").read_text())
    snippet, proc = at_once(
        lambda: knobtune("export", study, "--format", "snippet", cwd=directory, check=0),
        lambda: run_script(script, *args, config=directory / "best.json", cwd=directory,
                           extra_env={"KNOBTUNE_WATCHDOG_S": "0.05"}))
    return best, snippet, proc


def printed_json(proc: subprocess.CompletedProcess, prefix: str) -> dict:
    """The JSON a script printed last on a line starting with ``prefix``."""
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith(prefix)][-1]
    return json.loads(line[len(prefix):])


def script_study(directory: Path, template: str, script: Path, args: list[str] | None = None,
                 trials: int = 3) -> Path:
    """A study file for a user's ``script``: ``template`` with {script}, {args}, {trials}, {burst}."""
    return study_file(directory, template.format(script=script, args=json.dumps(args or []), trials=trials,
                                                 burst=TINY_BURST))


def stored(directory: Path, name: str):
    """The study ``name`` in ``directory``'s knobtune.db."""
    import optuna

    return optuna.load_study(study_name=name, storage=f"sqlite:///{directory / 'knobtune.db'}")
