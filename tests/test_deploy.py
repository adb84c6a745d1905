"""The deployment files (deploy/) run commands the CLI accepts: a manifest or unit that drifted
from the CLI would fail only on a user's cluster."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

from knobtune.search.cli import parser

ROOT = Path(__file__).resolve().parent.parent


def _parses(argv: list[str]) -> None:
    args = parser().parse_args(argv)  # argparse exits (SystemExit) on anything it does not accept
    assert args.command == "worker"


def test_the_kubernetes_job_runs_a_worker_the_cli_accepts():
    docs = list(yaml.safe_load_all((ROOT / "deploy/kubernetes/worker-job.yaml").read_text()))
    jobs = [d for d in docs if d and d.get("kind") == "Job"]
    assert jobs
    containers = jobs[0]["spec"]["template"]["spec"]["containers"]
    command = containers[0]["command"] + containers[0].get("args", [])
    assert command[:2] == ["knobtune", "worker"]
    _parses(command[1:])
    env = {e["name"]: e for e in containers[0].get("env", [])}
    assert "KNOBTUNE_STORAGE" in env  # the URL (and its password) comes from the environment, not argv
    for path in (ROOT / "deploy/kubernetes").glob("*.yaml"):
        assert list(yaml.safe_load_all(path.read_text()))


def test_the_systemd_unit_runs_a_worker_the_cli_accepts():
    unit = (ROOT / "deploy/systemd/knobtune-worker@.service").read_text()
    start = re.search(r"^ExecStart=(.+)$", unit, re.M)
    assert start
    argv = shlex.split(start.group(1).replace("%i", "demo"))
    assert argv[0].endswith("/knobtune") and argv[1] == "worker"
    _parses(argv[1:])
    assert re.search(r"^KillSignal=SIGINT$", unit, re.M)  # stop = Ctrl-C: the worker stops its own children
