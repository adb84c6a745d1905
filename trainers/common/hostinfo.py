"""Framework-free facts about the host: CPU, usable cores, memory, software versions."""
from __future__ import annotations

import math
import os
import platform
import sys
from importlib import metadata
from pathlib import Path


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# x86's AVX-512 BF16 and AMX tiles, Arm's BF16 extension: bfloat16 arithmetic in hardware
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU's feature flags (x86 ``flags``, Arm ``Features``) from /proc/cpuinfo; empty where
    it cannot be read."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def cpu_bf16_native(cpuinfo: str | None = None) -> bool:
    """Whether this CPU does bfloat16 arithmetic in hardware. Elsewhere a CPU's bf16 autocast
    is emulated: on an AVX2 EPYC it trained at two thirds of fp32's speed."""
    return bool(cpu_flags(cpuinfo) & BF16_CPU_FLAGS)


def _cgroup_cpu_limit() -> float | None:
    """CPUs allowed by a cgroup v2 quota (``cpu.max``), or None when unlimited or unknown."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return int(quota) / int(period)


def usable_cores() -> int:
    """Cores this process may really use: its CPU affinity, capped by a cgroup quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    limit = _cgroup_cpu_limit()
    if limit is not None:
        cores = min(cores, max(1, math.ceil(limit)))
    return max(1, cores)


def memory_total_mb() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except OSError:
        pass
    return None


def _cgroup_bytes(name: str) -> int | None:
    try:
        raw = Path(f"/sys/fs/cgroup/{name}").read_text().strip()
    except OSError:
        return None
    return None if raw == "max" or not raw.isdigit() else int(raw)


def memory_room_mb() -> float | None:
    """The host memory this process may grow into: what it holds now plus what is available
    (the smaller of the machine's and its cgroup's), in MiB; None where it cannot be read."""
    try:
        import psutil
    except ImportError:
        return None
    held = psutil.Process().memory_info().rss
    room = psutil.virtual_memory().available
    limit, used = _cgroup_bytes("memory.max"), _cgroup_bytes("memory.current")
    if limit is not None and used is not None:
        room = min(room, max(0, limit - used))
    return (held + room) / 2**20


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def host() -> dict[str, object]:
    """The framework-free part of the fingerprint."""
    return {
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "usable_cores": usable_cores(),
        "memory_mb": memory_total_mb(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "optuna": package_version("optuna"),
        "optuna_dashboard": package_version("optuna-dashboard"),
        "sqlalchemy": package_version("sqlalchemy"),
        "knobtune": package_version("knobtune"),
    }


def placement() -> dict[str, object]:
    """Where this process really runs: its CPU affinity and the GPUs it was shown (a trial's
    result carries it, so a partitioned run can show that no two trials overlapped)."""
    try:
        affinity: list[int] | None = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        affinity = None
    return {"affinity": affinity, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


def physical_groups(cores: list[int], root: str = "/sys/devices/system/cpu") -> list[tuple[int, ...]]:
    """``cores`` grouped by physical core: hyperthreads of one core (``thread_siblings_list``)
    form one group, which a partition takes whole. Without topology information each core is
    its own group."""
    allowed, groups, seen = set(cores), [], set()
    for core in cores:
        if core in seen:
            continue
        try:
            text = open(f"{root}/cpu{core}/topology/thread_siblings_list").read().strip()
            siblings = set()
            for part in text.split(","):
                low, _, high = part.partition("-")
                siblings.update(range(int(low), int(high or low) + 1))
        except (OSError, ValueError):
            siblings = {core}
        group = tuple(sorted((siblings & allowed) | {core}))
        seen.update(group)
        groups.append(group)
    return groups


def rank_shares(cores: list[int], nproc: int, groups: list[tuple[int, ...]] | None = None) -> list[tuple[int, ...]]:
    """``cores`` divided between the ``nproc`` ranks of a data-parallel trial: the same number of
    physical cores each (hyperthread siblings stay together, as between ``--jobs`` trials; cores
    that do not divide evenly stay unused). Raises ValueError when there are fewer physical cores
    than ranks."""
    groups = groups if groups is not None else physical_groups(cores)
    if nproc > len(groups):
        raise ValueError(f"{nproc} ranks need a physical core each; {len(groups)} are usable here "
                         f"({' '.join('+'.join(map(str, g)) for g in groups)})")
    share = len(groups) // nproc
    return [tuple(c for g in groups[r * share:(r + 1) * share] for c in g) for r in range(nproc)]
