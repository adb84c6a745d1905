"""Dividing one machine between trials that run at once: each gets its own GPU (when there are
GPUs) and its own share of the CPU cores, so no two trials distort each other's numbers.

A child is pinned before it starts (``CUDA_VISIBLE_DEVICES``; CPU affinity, which its DataLoader
workers and tf.data threads inherit), and reads its placement back into its result.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from knobtune.search.errors import UserError
from knobtune.trainers.common.hostinfo import physical_groups, rank_shares

__all__ = ["Partition", "group_size", "jobs_count", "machine_cores", "physical_groups", "plan", "rank_shares",
           "visible_gpus"]


@dataclass(frozen=True)
class Partition:
    """One trial slot: its index, the CPU cores it may use and the GPU it sees (a
    ``CUDA_VISIBLE_DEVICES`` entry), or None for every GPU (or none on a CPU box)."""

    index: int
    cores: tuple[int, ...]
    gpu: str | None = None

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """The child's environment: ``base`` with this partition's GPU made the only one visible."""
        return base if self.gpu is None else {**base, "CUDA_VISIBLE_DEVICES": self.gpu}

    def pin(self) -> None:
        """In the child, before exec: run on this partition's cores only."""
        os.sched_setaffinity(0, self.cores)

    def describe(self) -> dict[str, Any]:
        return {"index": self.index, "cores": list(self.cores), "gpu": self.gpu}


def machine_cores() -> list[int]:
    """The cores this process may use (its affinity, capped by a cgroup CPU quota)."""
    cores = sorted(os.sched_getaffinity(0))
    try:
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()[:2]
        if quota != "max":
            cores = cores[:max(1, math.ceil(int(quota) / int(period)))]
    except (OSError, ValueError):
        pass
    return cores


def visible_gpus(count: int, environ: dict[str, str] | None = None) -> list[str]:
    """The ``CUDA_VISIBLE_DEVICES`` entries for the ``count`` GPUs this process sees: the parent's
    own list when it has one (so a box restricted to GPUs 2,3 hands out 2 and 3), else 0..count-1."""
    env = os.environ if environ is None else environ
    listed = [g.strip() for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    if "CUDA_VISIBLE_DEVICES" in env and listed:
        return listed[:count]
    return [str(i) for i in range(count)]


def group_size(option: int | str, gpus: list[str], groups: list[tuple[int, ...]]) -> int:
    """``[study] nproc``: ranks per trial, or "auto" (one per visible GPU; 1 on a CPU-only
    machine). Refused in one line when there are fewer GPUs (or, without GPUs, physical cores) than ranks."""
    if option == "auto":
        return max(1, len(gpus))
    nproc = int(option)
    if gpus and nproc > len(gpus):
        raise UserError(f"[study] nproc = {nproc}: this machine shows {len(gpus)} GPU(s) ({', '.join(gpus)}); each "
                        f"rank needs its own")
    if not gpus and nproc > len(groups):
        raise UserError(f"[study] nproc = {nproc}: this machine has no GPU and {len(groups)} usable physical core(s); "
                        f"each rank needs at least one core")
    return nproc


def jobs_count(option: str | int | None, gpus: list[str], cores: int | None = None, nproc: int = 1) -> int:
    """``--jobs``: a number, or "auto" (one per ``nproc`` GPUs, at most one per ``nproc``
    physical cores; 1 on a CPU-only machine); default 1."""
    if option is None:
        return 1
    if str(option).lower() == "auto":
        per_gpus = len(gpus) // nproc
        return max(1, min(per_gpus, cores // nproc) if cores is not None else per_gpus)
    try:
        jobs = int(option)
    except ValueError:
        raise UserError(f"--jobs {option!r}: expected a number >= 1 or 'auto'") from None
    if jobs < 1:
        raise UserError(f"--jobs {jobs}: expected a number >= 1 or 'auto'")
    return jobs


def plan(jobs: int, cores: list[int], gpus: list[str], groups: list[tuple[int, ...]] | None = None,
         nproc: int = 1) -> list[Partition]:
    """``jobs`` equal partitions: ``nproc`` GPUs each when there are GPUs (one per rank of a
    data-parallel trial), and the same number of physical cores each (``groups``: hyperthread
    siblings stay together, so two trials never share a physical core; cores that do not divide
    evenly are left unused: unequal shares would not compare)."""
    groups = groups if groups is not None else [(c,) for c in cores]
    if gpus and jobs * nproc > len(gpus):
        per = f"{nproc} GPUs per trial (nproc = {nproc})" if nproc > 1 else "at most one trial per GPU"
        raise UserError(f"--jobs {jobs}: this machine has {len(gpus)} GPU(s) ({', '.join(gpus)}); {per}")
    if jobs * nproc > len(groups):
        what = (f"{len(cores)} usable core(s) ({', '.join(map(str, cores))})" if len(groups) == len(cores) else
                f"{len(groups)} physical core(s) ({' '.join('+'.join(map(str, g)) for g in groups)}: hyperthreads of "
                f"one core stay together)")
        each = (f"each trial needs {nproc} (one per rank, nproc = {nproc})" if nproc > 1
                else "each trial needs at least one")
        raise UserError(f"--jobs {jobs}: this machine has {what}; {each}")
    shares = rank_shares(cores, jobs, groups)
    return [Partition(i, shares[i], ",".join(gpus[i * nproc:(i + 1) * nproc]) if gpus else None)
            for i in range(jobs)]
