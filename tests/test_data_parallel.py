"""Data-parallel trials ([study] nproc): each trial a group of real ranks over gloo on this CPU,
through the CLI and the child, measured and failed as one job; the winner run under torchrun."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from knobtune.search.launch import partition
from knobtune.search.launch.runner import run_child
from knobtune.search.storage.record import TrialRecord
from knobtune.spaces.pytorch import DDP_KNOBS
from knobtune.trainers.common.wire import Burst, Request

from conftest import FAST, TINY_BURST, WORKLOADS, knobtune, script_study, stored, study_file

SCRIPT = WORKLOADS / "kt_script.py"
PHYSICAL = len(partition.physical_groups(partition.machine_cores()))
pytestmark = pytest.mark.skipif(PHYSICAL < 2, reason="two ranks need two physical cores")

BUILTIN = """
[study]
name = "dp"
framework = "pytorch"
workload = "kt_test_workloads:tiny"
trials = 2
seed = 1
prune_below = 0
nproc = 2
{burst}
[baseline]          # (the space always keeps the baseline's values: these make every trial use them)
batch_size = 16
ddp_bucket_cap_mb = 5
ddp_comm_hook = "fp16"
[space]
batch_size = [16]
accumulation_steps = [1]
compile = ["off"]
ddp_bucket_cap_mb = [5]
ddp_comm_hook = ["fp16"]
"""

SCRIPTED = """
[study]
name = "dp-script"
framework = "pytorch"
script = "{script}"
args = {args}
trials = {trials}
seed = 1
prune_below = 0
nproc = 2
{burst}
[baseline]
batch_size = 16
ddp_gradient_as_bucket_view = true
ddp_static_graph = true
[space]
batch_size = [16]
accumulation_steps = [1]
compile = ["off"]
amp = ["off"]
ddp_gradient_as_bucket_view = [true]
ddp_static_graph = [true]
"""


def test_a_builtin_study_measures_each_trial_as_one_group_of_ranks(tmp_path: Path):
    proc = knobtune("run", str(study_file(tmp_path, BUILTIN.format(burst=TINY_BURST))), *FAST, cwd=tmp_path, check=0)
    assert "2 ranks per trial (data-parallel), each on" in proc.stderr
    assert "on one rank's share of 2" in proc.stderr  # the probe saw what one rank sees
    study = stored(tmp_path, "dp")
    trials = [TrialRecord.of(t) for t in study.trials]
    assert len(trials) == 2 and all(t.outcome == "ok" for t in trials), [t.failure for t in trials]
    searched = trials[0]
    group = searched.group
    assert group["nproc"] == 2 and group["backend"] == "gloo" and group["slowest_rank"] in (0, 1)
    ranks = group["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["outcome"] == "ok" for r in ranks)
    assert not set(ranks[0]["cores"]) & set(ranks[1]["cores"])  # each rank on its own cores ...
    assert [r["placement"]["affinity"] for r in ranks] == [r["cores"] for r in ranks]  # ... as read back there
    # the group trains [burst] train_samples in all, in batches of 16 per rank: 32 per step
    assert searched.effective_batch_size == 32
    assert 640 - 32 < searched.trained_samples <= 640 + 32
    assert searched.samples_per_second > max(r["samples_per_second"] for r in ranks)  # the ranks' samples together
    # the DDP knobs as the wrapped model reports them (a value read back unlike the one asked for says why)
    knobs = searched.knobs
    assert knobs["ddp_bucket_cap_mb"].value == 5 and knobs["ddp_comm_hook"].value == "fp16"
    assert all(knobs[k].applied and knobs[k].why is None for k in DDP_KNOBS if k != "ddp_broadcast_buffers")
    assert "no buffers" in knobs["ddp_broadcast_buffers"].why  # the MLP has none
    scaling = study.user_attrs["scaling"]  # the group and one rank alone, back to back
    assert scaling["nproc"] == 2 and scaling["winner_trial"] in (0, 1)
    assert scaling["baseline"]["efficiency"] == pytest.approx(
        scaling["baseline"]["group"] / (2 * scaling["baseline"]["one_rank"]))
    assert "scaling baseline: 2 ranks run" in proc.stdout and "one rank alone, back to back" in proc.stdout
    share = study.user_attrs["partition"]
    assert share["nproc"] == 2 and share["cores_per_rank"] >= 1


@pytest.mark.long
def test_a_script_study_of_two_ranks_and_its_winner_under_torchrun(tmp_path: Path):
    path = script_study(tmp_path, SCRIPTED, SCRIPT, ["--epochs", "50"], trials=2)
    knobtune("run", str(path), *FAST, cwd=tmp_path, check=0)
    trials = [TrialRecord.of(t) for t in stored(tmp_path, "dp-script").trials]
    assert all(t.outcome == "ok" and t.group["nproc"] == 2 for t in trials), [t.failure for t in trials]
    assert all(t.knobs["ddp_static_graph"].value is True for t in trials)
    knobtune("export", "dp-script", "-o", "best.json", cwd=tmp_path, check=0)
    best = json.loads((tmp_path / "best.json").read_text())
    assert best["partition"]["nproc"] == 2 and best["group"]["nproc"] == 2 and best["group"]["backend"] == "gloo"
    assert "torchrun --nproc_per_node 2" in best["group"]["launch"]
    snippet = knobtune("export", "dp-script", "--format", "snippet", cwd=tmp_path, check=0).stdout
    assert "sampler=DistributedSampler(train_set)" in snippet
    assert "DistributedDataParallel(model, device_ids=[local_rank] if device.type == 'cuda' else None, " \
           "gradient_as_bucket_view=True, static_graph=True)" in snippet
    compile(snippet, "snippet.py", "exec")
    env = {**os.environ, "KNOBTUNE_CONFIG": str(tmp_path / "best.json"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(SCRIPT), "--epochs", "1"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(ln[len("stats "):]) for ln in proc.stdout.splitlines() if ln.startswith("stats ")]
    assert len(lines) == 2  # both ranks trained to the end
    for stats in lines:  # each rank's model wrapped in DDP with the winner's settings, read back
        assert {k: stats["knobs"][k] for k in DDP_KNOBS} == {k: best["knobs"][k] for k in DDP_KNOBS}
        assert stats["knobs"]["ddp_gradient_as_bucket_view"] is True
    assert "was measured as" not in proc.stderr  # the same number of ranks as measured: no warning
    alone = subprocess.run([sys.executable, str(SCRIPT), "--epochs", "1"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert "was measured as 2 data-parallel ranks (KNOBTUNE_CONFIG=best.json torchrun --nproc_per_node 2" in \
        alone.stderr and "this job runs 1 process(es)" in alone.stderr


def _group_trial(args: list[str]) -> tuple:
    request = Request(script=str(SCRIPT), args=("--epochs", "50", *args), knobs={"batch_size": 16}, nproc=2,
                      burst=Burst(train_samples=1280, warmup_samples=64, windows=3), workdir=str(WORKLOADS))
    return run_child("pytorch", "burst", request, 120)


def test_one_ranks_nan_is_the_groups(tmp_path: Path):
    child = _group_trial(["--rank", "1", "--nan-after", "10"])
    assert child.outcome == "nan", child.failure
    assert "of 2: loss became non-finite at step" in child.failure  # rank 0's guard saw rank 1's loss


def test_a_rank_killed_mid_burst_ends_the_trial_and_leaves_no_rank(tmp_path: Path):
    child = _group_trial(["--rank", "1", "--die-after", "10", "--pids", str(tmp_path)])
    assert child.outcome == "crash" and "rank 1 of 2 was killed by signal 15" in child.failure, child.failure
    assert child.wall_seconds < 60  # ended as one job, not by the timeout
    for pid in (int((tmp_path / f"rank{r}.pid").read_text()) for r in (0, 1)):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_ranks_that_disagree_end_with_the_reason(tmp_path: Path):
    # rank 1 leaves kt.batches early; rank 0 waits for it at the next boundary, in vain
    child = _group_trial(["--rank", "1", "--stop-after", "10"])
    assert child.outcome == "invalid", child.failure
    assert child.failure.startswith("rank 1 of 2: the script stopped iterating kt.batches(...) after 10 of")
    assert "the ranks disagree" in child.failure


def test_what_cannot_run_is_refused_before_any_trial(tmp_path: Path):
    too_many = BUILTIN.format(burst=TINY_BURST).replace("nproc = 2", f"nproc = {PHYSICAL + 1}")
    proc = knobtune("run", str(study_file(tmp_path, too_many, "many.toml")), *FAST, cwd=tmp_path, check=2)
    assert f"[study] nproc = {PHYSICAL + 1}: this machine has no GPU and {PHYSICAL} usable physical core(s)" in \
        proc.stderr
    proc = knobtune("run", str(study_file(tmp_path, BUILTIN.format(burst=TINY_BURST))), "--jobs",
                    str(PHYSICAL // 2 + 1), *FAST, cwd=tmp_path, check=2)
    assert "each trial needs 2 (one per rank, nproc = 2)" in proc.stderr
    path = script_study(tmp_path, SCRIPTED, SCRIPT, ["--no-prepare"], trials=1)
    proc = knobtune("run", str(path), *FAST, cwd=tmp_path, check=2)
    assert "the script never calls kt.prepare(model): a data-parallel study (nproc = 2)" in proc.stderr
    assert "trial #" not in proc.stderr  # (refused at the probe, before the study had a trial)
