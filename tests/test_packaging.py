"""One import name: the wheel installs ``knobtune`` and nothing else at the top level, no module
imports the old top-level names, and a user project with its own ``trainers/``, ``search/`` and
``spaces/`` packages is tuned through the built-in workload and through its own script."""
from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

from conftest import FAST, ROOT, TINY_BURST, knobtune, stored, study_file

OLD_NAMES = ("search", "spaces", "trainers")
# the source folders and the package each installs as (pyproject.toml's package-dir)
INSTALLED_AS = {"knobtune": "knobtune", "search": "knobtune/search", "spaces": "knobtune/spaces",
                "trainers": "knobtune/trainers"}


_MODULE_STRING = re.compile(r"(search|spaces|trainers)\.\w")
_RUN_MODULE = re.compile(r"-m\s+(search|spaces|trainers)\b")


# benchmarks/trial_path.py runs an older checkout's own entry point, to compare the two (and this
# list names it)
ALLOWED = {("benchmarks/trial_path.py", "search.cli"), ("tests/test_packaging.py", "search.cli")}


def _python_files() -> list[Path]:
    skip = {".git", ".venv", "build", "dist", "__pycache__", ".pytest_cache"}
    return sorted(p for p in ROOT.rglob("*.py") if not skip.intersection(p.relative_to(ROOT).parts))


def test_no_module_imports_the_old_top_level_names():
    offenders = []
    for path in _python_files():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                # a module named in a string (importlib.import_module, python -m), f-strings' pieces too
                if _MODULE_STRING.match(node.value) or _RUN_MODULE.search(node.value):
                    names = [node.value]
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno}: {name}" for name in names
                          if (name.split(".")[0] in OLD_NAMES or _RUN_MODULE.search(name))
                          and (str(path.relative_to(ROOT)), name) not in ALLOWED]
    # and the command lines and docs that name a module to run or import
    pattern = re.compile(r"(-m|from|import)\s+(search|spaces|trainers)\.")
    for path in [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("benchmarks/*.sh"),
                 *(p for p in (ROOT / "deploy").rglob("*") if p.is_file())]:
        offenders += [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
                      for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert not offenders, "old top-level import names:\n" + "\n".join(offenders)


def test_the_wheel_installs_one_top_level_name_and_every_module(tmp_path: Path):
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in INSTALLED_AS:
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "wheel"
    out.mkdir()
    build = subprocess.run([sys.executable, "-c", f"from setuptools import build_meta; "
                            f"print(build_meta.build_wheel({str(out)!r}))"],
                           cwd=source, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    wheel = out / build.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        top_level = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        record = [n for n in names if n.endswith(".dist-info/RECORD")]
        declared = set(zf.read(top_level[0]).decode().split()) if top_level else None
        recorded = zf.read(record[0]).decode().splitlines()
    installed = {line.split(",")[0].split("/")[0] for line in recorded if line}
    assert {n for n in installed if not n.endswith(".dist-info")} == {"knobtune"}
    if declared is not None:
        assert declared == {"knobtune"}
    # every source module is in the wheel, where its package-dir puts it (a new sub-package missing
    # from pyproject.toml's list would be left out silently)
    expected = {f"{INSTALLED_AS[p.relative_to(ROOT).parts[0]]}/{'/'.join(p.relative_to(ROOT).parts[1:])}"
                for p in _python_files() if p.relative_to(ROOT).parts[0] in INSTALLED_AS}
    assert expected - set(names) == set()
    assert not [n for n in names if n.endswith(".py") and not n.startswith("knobtune/")]


# A user's project whose own packages are named like knobtune's old top-level ones. Each raises if
# anything but the user's own code imports it, so knobtune touching one fails loudly.
DECOY = 'import os\nif os.environ.get("DECOY_OK") != "1":\n    raise ImportError("knobtune imported the user\'s own {name!r} package")\n'

USER_SCRIPT = '''\
"""A user's script that imports its own trainers package as well as knobtune."""
import os
os.environ["DECOY_OK"] = "1"
import torch
from torch import nn

from knobtune.pytorch import Tuned
from trainers.models import make_model, ORIGIN

assert ORIGIN == "the user's trainers", ORIGIN

kt = Tuned.load()
g = torch.Generator().manual_seed(0)
x = torch.randn(512, 16, generator=g)
y = (x[:, 0] > 0).long()
loader = kt.dataloader(torch.utils.data.TensorDataset(x, y), shuffle=True, batch_size=32)
model = make_model()
trained = kt.prepare(model)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
loss_fn = nn.CrossEntropyLoss()
for epoch in range(50):
    for xb, yb in kt.batches(loader):
        with kt.autocast():
            loss = loss_fn(trained(xb), yb)
        kt.backward(loss, optimizer)
with torch.no_grad():
    kt.report(val_accuracy=float((model(x).argmax(1) == y).float().mean()))
'''


STUDY = """
[study]
name = "{name}"
framework = "pytorch"
{what}
trials = 2
seed = 1
prune_below = 0
{burst}
[space]
batch_size = [32, 64]
accumulation_steps = [1]
compile = ["off"]
amp = ["off"]
optimizer_impl = ["default"]
"""


def _user_project(directory: Path) -> None:
    for name in OLD_NAMES:
        (directory / name).mkdir()
        (directory / name / "__init__.py").write_text(DECOY.format(name=name))
    (directory / "trainers" / "models.py").write_text(textwrap.dedent('''\
        from torch import nn
        ORIGIN = "the user's trainers"
        def make_model():
            return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
        '''))
    (directory / "train.py").write_text(USER_SCRIPT)


def test_a_user_project_with_its_own_trainers_search_and_spaces_packages(tmp_path: Path):
    _user_project(tmp_path)
    for name, what in (("builtin", 'workload = "digits-mlp"'), ("script", 'script = "train.py"')):
        study_file(tmp_path, STUDY.format(name=name, what=what, burst=TINY_BURST), name=f"{name}.toml")
    for name in ("builtin", "script"):
        # python -m knobtune from the project: its folder is first on sys.path, in the engine and in
        # every child
        proc = knobtune("run", f"{name}.toml", *FAST, cwd=tmp_path)
        assert proc.returncode == 0, f"{name}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
        assert "ImportError" not in proc.stderr
        outcomes = [t.user_attrs.get("outcome") for t in stored(tmp_path, name).trials]
        assert outcomes == ["ok", "ok"], (name, outcomes, proc.stderr[-3000:])
