"""Ranks launched by knobtune.trainers.pytorch.group, for tests/test_group.py:

    python kt_group_script.py SCENARIO NPROC GRACE_S OUTDIR

allreduce (every rank sums rank+1 over gloo, through the env:// rendezvous a script uses), crash
(rank 1 raises while rank 0 waits in a barrier), disagree (rank 1 leaves while rank 0 waits in a
barrier), straggle (rank 1 leaves while rank 0 is busy outside any collective), hang (every rank
sleeps; the test kills the launcher). Prints the GroupEnd as JSON."""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from knobtune.trainers.pytorch.group import launch

SCENARIO, NPROC, GRACE, OUT = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), Path(sys.argv[4])


def body(rank: int) -> int:
    (OUT / f"rank{rank}.pid").write_text(str(os.getpid()))
    if SCENARIO == "hang" or (SCENARIO == "straggle" and rank == 0):
        time.sleep(600)
    if SCENARIO == "straggle":
        return 0
    dist.init_process_group("gloo")
    if SCENARIO == "allreduce":
        total = torch.tensor([rank + 1.0])
        dist.all_reduce(total)
        env = {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")}
        (OUT / f"rank{rank}.json").write_text(json.dumps({"sum": total.item(), "env": env}))
    elif rank == 1 and SCENARIO == "crash":
        raise RuntimeError("rank 1 breaks")
    elif rank == 1 and SCENARIO == "disagree":
        return 0  # leaves without the barrier the others wait in
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "launcher.pid").write_text(str(os.getpid()))
    end = launch(NPROC, body, grace_s=GRACE)
    print(json.dumps({**dataclasses.asdict(end), "ok": end.ok, "reason": end.reason()}), flush=True)
