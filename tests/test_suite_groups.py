"""The suite's own scheduling (tests/xdist_groups.py): under pytest-xdist's ``--dist loadgroup``,
as the Makefile runs it, the tests that share a module-scoped fixture run in one worker, which
builds the fixture once; run in a real pytest-xdist session of two workers."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parent

MODULE = '''
import os
from pathlib import Path

import pytest

LOG = Path(os.environ["GROUPS_LOG"])


def note(line):
    with LOG.open("a") as f:
        f.write(line + "\\n")


@pytest.fixture(scope="module")
def built():
    note(f"built {os.environ['PYTEST_XDIST_WORKER']}")
    return 1


@pytest.mark.parametrize("i", range(6))
def test_shares(built, i):
    note(f"shares {os.environ['PYTEST_XDIST_WORKER']}")


@pytest.mark.parametrize("i", range(6))
def test_alone(i):
    note(f"alone {os.environ['PYTEST_XDIST_WORKER']}")
'''


def test_tests_of_a_module_fixture_run_in_one_worker_which_builds_it_once(tmp_path: Path):
    (tmp_path / "test_grouped.py").write_text(textwrap.dedent(MODULE))
    log = tmp_path / "log.txt"
    env = {**os.environ, "GROUPS_LOG": str(log),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "xdist_groups", "-p", "no:cacheprovider", "-q",
                           "-n", "2", "--dist", "loadgroup", "--rootdir", str(tmp_path), "test_grouped.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line.split() for line in log.read_text().splitlines()]
    workers = {kind: [w for k, w in lines if k == kind] for kind in ("built", "shares", "alone")}
    assert len(workers["shares"]) == 6 and len(workers["alone"]) == 6
    assert len(set(workers["shares"])) == 1, f"the fixture's tests ran in several workers: {workers['shares']}"
    assert workers["built"] == workers["shares"][:1]  # built once, where its tests ran
