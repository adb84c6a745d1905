"""The child-process entry point every trainer shares: a ``Request`` in, a ``Result`` out (their JSON:
trainers/common/wire.py).

``python -m knobtune.trainers.<framework> COMMAND --request IN.json --result OUT.json``. Exit 0 with a
result (outcome ok, nan, oom or invalid), exit 2 with ``{"error": ...}`` when the user's
workload is at fault, anything else (a traceback and exit 1, a signal) is a crash that the
parent classifies from the exit status and the tail of stderr.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, NoReturn

from knobtune.trainers.common.errors import InvalidKnobs, WorkloadError
from knobtune.trainers.common.wire import Request, Result

Handler = Callable[[Request], Result]

# How this process started: "fresh" (python -m knobtune.trainers.<framework>) or "forked" (from the warm
# server, trainers/common/forkserver.py, which sets it); every result says which.
STARTED = "fresh"


def _finite(value: Any) -> Any:
    """JSON has no NaN/Inf: replace them with None, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_finite(data), allow_nan=False, default=str))
    os.replace(tmp, path)


def probe_handler(fingerprint: Callable[[], dict[str, Any]],
                  describe: Callable[[Request], dict[str, Any]]) -> Handler:
    """The ``probe`` command: the fingerprint, and the workload (or script) described when one is named."""

    def probe(request: Request) -> Result:
        described = describe(request) if request.workload or request.script else None
        return Result(outcome="ok", fingerprint=fingerprint(), workload=described)

    return probe


def main(framework: str, commands: tuple[str, ...], handlers: Callable[[], dict[str, Handler]],
         argv: list[str] | None = None) -> NoReturn:
    """Parse the command line, check the framework's version, run the command's handler
    (``handlers()`` imports them, after the check), write the result and exit at once."""
    from knobtune.trainers.common import hostinfo, versions

    parser = argparse.ArgumentParser(prog=f"python -m knobtune.trainers.{framework}")
    parser.add_argument("command", choices=sorted(commands))
    parser.add_argument("--request", type=Path, required=True)
    parser.add_argument("--result", type=Path, required=True)
    args = parser.parse_args(argv)
    request = Request.from_json(json.loads(args.request.read_text()))
    # User workloads named "package.module:factory" import from the directory knobtune ran in.
    workdir = request.workdir
    if workdir and workdir not in sys.path:
        sys.path.insert(0, workdir)
    try:
        problem = versions.check(framework)
        if problem:
            raise WorkloadError(problem)
        result = replace(handlers()[args.command](request), placement=hostinfo.placement(), child_start=STARTED)
        code = 0
    except WorkloadError as exc:
        result, code = Result(error=str(exc)), 2
    except InvalidKnobs as exc:
        result, code = Result(outcome="invalid", failure=str(exc)), 0
    write_json(args.result, result.to_json())
    # Leave at once: the result is written, and interpreter teardown (DataLoader workers, tf.data
    # threads, CUDA contexts, a user's atexit handlers) can be slow or crash; the parent kills the
    # process group anyway.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
