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
