"""The README's example studies on user workloads run as a new user would run them."""
from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from conftest import FAST, ROOT, knobtune


@pytest.mark.parametrize("study", [
    "custom-pytorch",
    pytest.param("custom-tensorflow", marks=pytest.mark.tensorflow),
])
def test_custom_workload_example_runs_from_the_repository_root(tmp_path: Path, study: str):
    url = f"sqlite:///{tmp_path / 'k.db'}"
    knobtune("run", f"studies/{study}.toml", "--trials", "2", "--storage", url, *FAST, cwd=ROOT, check=0)
    trials = optuna.load_study(study_name=study, storage=url).trials
    assert trials[0].user_attrs["outcome"] == "ok"
    assert trials[1].user_attrs["outcome"] in ("ok", "pruned")  # the seeds' advice may well be slower here
    assert trials[0].user_attrs["val_accuracy"] > 0.8  # the example workloads learn
