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


def test_own_loop_example_is_tuned_and_runs_its_winner_in_production(tmp_path: Path):
    """studies/own_loop_pytorch.py (the README's six-line change) tuned, exported, run in production."""
    import json

    from conftest import TINY_BURST, printed_json, run_script, study_file

    script = ROOT / "studies" / "own_loop_pytorch.py"
    path = study_file(tmp_path, f"""
[study]
name = "own-example"
framework = "pytorch"
script = "{script}"
args = ["--epochs", "2"]
trials = 3
prune_below = 0
{TINY_BURST}
[space]
batch_size = [32, 64]
compile = ["off"]
""")
    knobtune("run", str(path), *FAST, cwd=tmp_path, check=0)
    study = optuna.load_study(study_name="own-example", storage=f"sqlite:///{tmp_path / 'knobtune.db'}")
    assert [t.user_attrs["outcome"] for t in study.trials] == ["ok"] * 3
    assert study.trials[0].user_attrs["knobs"]["batch_size"]["value"] == 64  # the script's own --batch-size
    knobtune("export", "own-example", "-o", "best.json", cwd=tmp_path, check=0)
    best = json.loads((tmp_path / "best.json").read_text())
    proc = run_script(script, "--epochs", "3", config=tmp_path / "best.json", cwd=tmp_path,
                      extra_env={"KNOBTUNE_WATCHDOG_S": "0.05"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("accuracy") == 3  # every epoch ran and was evaluated
    stats = printed_json(proc, "knobtune stats: ")
    for knob in ("batch_size", "num_workers", "amp", "intra_op_threads"):
        assert stats["knobs"][knob] == best["knobs"][knob], knob
    assert stats["intervals"] >= 2 and stats["mean_samples_per_second"] > 0
