"""How far one trial travels through the code: the files its call path passes through, from
``knobtune run`` to the stored result, and how often it leaves a file and comes back to it.

Runs a one-trial study (the baseline of digits-mlp, a tiny burst, no confirmation or diagnosis)
with every knobtune process traced by ``sys.setprofile`` (a ``sitecustomize`` on PYTHONPATH): the
engine (its main thread and the thread that measures the trial) and the trial's child (a fresh
process: KNOBTUNE_FORK_SERVER=0). The current file is that of the innermost knobtune function
frame (the bodies of modules and classes, run on import, are not followed). Reported per process and thread: the
files entered, the distinct crossings from one file to another (a loop over batches crosses the
same ones again: counted once), and how many of those go back to a file the path left (a -> b
after b -> a): the back and forth a reader follows.

    python benchmarks/trial_path.py [--root REPO] [--files]

``--root`` traces another checkout (the same study file; its own ``python -m`` entry point), so
two commits can be compared on one machine; ``--files`` lists each process's files in order.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SITECUSTOMIZE = '''
import os, sys, threading
_out = os.environ.get("KT_TRACE_DIR")
if _out:
    _root = os.environ["KT_TRACE_ROOT"].rstrip("/") + "/"
    _skip = (_root + "tests/", _root + "benchmarks/", _root + ".venv/")
    _files = {}
    _last = {}

    def _mine(filename):
        hit = _files.get(filename)
        if hit is None:
            hit = _files[filename] = filename.startswith(_root) and not filename.startswith(_skip)
        return hit

    def _record(filename):
        key = threading.get_ident()
        if _last.get(key) == filename:
            return
        _last[key] = filename
        with open(os.path.join(_out, f"{os.getpid()}.jsonl"), "a") as f:
            f.write('["%s", %d, "%s"]\\n' % (threading.current_thread().name, key, filename[len(_root):]))

    def _followed(code):  # functions (CO_OPTIMIZED): not a module's or a class's body run on import
        return code.co_flags & 1 and _mine(code.co_filename)

    def _profile(frame, event, arg):
        if event == "call":
            if _followed(frame.f_code):
                _record(frame.f_code.co_filename)
        elif event == "return" and _followed(frame.f_code):
            back = frame.f_back
            while back is not None and not _followed(back.f_code):
                back = back.f_back
            if back is not None:
                _record(back.f_code.co_filename)

    sys.setprofile(_profile)
    threading.setprofile(_profile)
    with open(os.path.join(_out, f"{os.getpid()}.argv"), "w") as f:
        f.write(" ".join(sys.argv))
'''

STUDY = """
[study]
name = "path"
framework = "pytorch"
workload = "digits-mlp"
trials = 1
seed = 1
[burst]
train_samples = 640
warmup_samples = 64
windows = 3
timeout_s = 300
[guard]
baseline_runs = 1
"""


def trace(root: Path, work: Path) -> dict[int, list[tuple[str, str]]]:
    """Run the study under ``root``'s code; per process, the (thread, file) stays in order."""
    hooks, traces = work / "hooks", work / "traces"
    hooks.mkdir()
    traces.mkdir()
    (hooks / "sitecustomize.py").write_text(textwrap.dedent(SITECUSTOMIZE))
    (work / "study.toml").write_text(STUDY)
    env = {**os.environ, "KT_TRACE_DIR": str(traces), "KT_TRACE_ROOT": str(root), "KNOBTUNE_FORK_SERVER": "0",
           "PYTHONPATH": os.pathsep.join([str(hooks), str(root), os.environ.get("PYTHONPATH", "")])}
    env.pop("KNOBTUNE_FORK_SERVER_DIR", None)
    entry = "knobtune" if (root / "knobtune" / "__main__.py").exists() else "search.cli"
    proc = subprocess.run([sys.executable, "-m", entry, "run", "study.toml", "--no-confirm", "--no-diagnose",
                           "--artifacts", "none"], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"the study failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    out: dict[int, list[tuple[str, str]]] = {}
    for path in sorted(traces.glob("*.jsonl")):
        pid = int(path.stem)
        argv = (traces / f"{pid}.argv").read_text() if (traces / f"{pid}.argv").exists() else ""
        if " probe " in f" {argv} ":  # the probe is a child of its own, not the trial's
            continue
        out[pid] = [(name if name == "MainThread" else "worker", file)
                    for name, _ident, file in map(json.loads, path.read_text().splitlines())]
    return out


def summarise(stays: list[str]) -> tuple[int, int, int]:
    """Files entered, distinct crossings between two files, and crossings back (a -> b after b -> a)."""
    crossings = list(dict.fromkeys(zip(stays, stays[1:])))
    seen: set[tuple[str, str]] = set()
    back = 0
    for a, b in crossings:
        back += (b, a) in seen
        seen.add((a, b))
    return len(set(stays)), len(crossings), back


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", type=Path, default=ROOT, help="the checkout to trace (default: this one)")
    p.add_argument("--files", action="store_true", help="list each process's files in the order first met")
    args = p.parse_args()
    root = args.root.resolve()
    with tempfile.TemporaryDirectory(prefix="knobtune-path-") as tmp:
        traced = trace(root, Path(tmp))
    every: set[str] = set()
    print(f"one trial's path through {root} (digits-mlp baseline, tiny burst):")
    for pid, stays in traced.items():
        by_thread: dict[str, list[str]] = defaultdict(list)
        for thread, file in stays:
            by_thread[thread].append(file)
        for thread, files in by_thread.items():
            distinct, count, returns = summarise(files)
            every.update(files)
            role = "engine" if any(f.startswith(("search/", "knobtune/__main__")) for f in files) else "child"
            print(f"  {role:6} {thread:10} {distinct:3} files, {count:3} crossings between files, {returns:3} of them "
                  f"back to a file left before")
            if args.files:
                print("      " + ", ".join(dict.fromkeys(files)))
    print(f"  all    {'':10} {len(every):3} files")


if __name__ == "__main__":
    main()
