"""``knobtune compare`` on two real studies, one per framework, recorded from real runs
(tests/data/mlp-*.json, rebuilt into a fresh SQLite file: no trial runs here; the runs
themselves are tested in test_cli.py and test_tensorflow.py)."""
from __future__ import annotations

import re
from pathlib import Path

import optuna

from conftest import knobtune
from recorded import rebuild


def test_compare_two_frameworks(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'knobtune.db'}"
    rebuild("mlp-pytorch", url)
    rebuild("mlp-tensorflow", url)
    proc = knobtune("compare", "mlp-pytorch", "mlp-tensorflow", "--storage", url, cwd=tmp_path, check=0)
    out = proc.stdout
    for row in ("baseline samples/s", "best samples/s", "best val_accuracy", "best warm-up s",
                "speedup over own baseline", "pytorch best knobs", "tensorflow best knobs"):
        assert row in out
    # the verdict is wrapped text whose words depend on the machine: assert on its parts, whitespace-free
    flat = re.sub(r"\s+", "", out)
    assert "Onthismachine(" in flat and "trainsdigits-mlpfaster" in flat and "Whatmadethedifference" in flat
    assert "confirmedmedians(interleavedrounds)" in flat and "Caution:" not in flat

    # a study with no confirmation is compared on its search figures, with a caution
    bare = rebuild("mlp-tensorflow", url, as_name="mlp-unconfirmed")
    bare.set_user_attr("confirmed", None)
    flat = re.sub(r"\s+", "", knobtune("compare", "mlp-pytorch", "mlp-unconfirmed", "--storage", url,
                                       cwd=tmp_path, check=0).stdout)
    assert "Caution:" in flat and "hasnoconfirmation" in flat

    # another workload: refused, unless --force
    other = rebuild("mlp-tensorflow", url, as_name="c-other")
    definition = other.user_attrs["definition"]
    other.set_user_attr("definition", {**definition, "study": {**definition["study"], "workload": "kt_tf_workloads:tiny"}})
    proc = knobtune("compare", "mlp-pytorch", "c-other", "--storage", url, cwd=tmp_path, check=2)
    assert "trains 'digits-mlp' but 'c-other' trains 'kt_tf_workloads:tiny'" in proc.stderr and "--force" in proc.stderr
    proc = knobtune("compare", "mlp-pytorch", "c-other", "--storage", url, "--force", cwd=tmp_path, check=0)
    assert "compared anyway" in proc.stdout

    # another machine: refused
    study = optuna.load_study(study_name="mlp-tensorflow", storage=url)
    study.set_user_attr("fingerprint", {**study.user_attrs["fingerprint"], "cpu_model": "Some Other CPU"})
    proc = knobtune("compare", "mlp-pytorch", "mlp-tensorflow", "--storage", url, cwd=tmp_path, check=2)
    assert "different hardware (cpu_model:" in proc.stderr
