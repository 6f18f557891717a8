"""How many intra-op threads the torch reference runner takes (`cpu_threads`).

By default every CPU this process may run on: its affinity (a cpuset), capped by its cgroup's CPU quota (a
Kubernetes CPU limit is a quota, not a cpuset: a pod limited to 2 CPUs on a 64-core node must not start 64
threads that each get a thirty-second of a core). Measured on the 2-core machine with SmolLM2-135M and the engine
core in its own process (2026-12-07, `bench/serve_sweep.py` beside vLLM CPU 0.32, whose default keeps one core for
its front end): both cores made 22.3 / 49.6 / 110 tok/s at 1 / 4 / 16 clients, one core 14.0 / 28.8 / 64.4; the
server's share of a step (0.2-0.6 ms) costs less than a core idle. Where other processes hold the cores (a test
suite beside it) a second OpenMP thread spins in its barriers while descheduled: set `cpu_threads` there.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Optional

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cpu_threads(requested: Optional[int], available: Optional[int] = None, quota: Optional[float] = None) -> int:
    """`requested`, else the CPUs this process may run on (`available`: its affinity), at most its cgroup's CPU
    quota (`quota` in CPUs, rounded down; None: no quota), at least one."""
    if requested is not None:
        return requested
    cpus = available if available is not None else len(os.sched_getaffinity(0))
    if quota is not None:
        cpus = min(cpus, math.floor(quota))
    return max(1, cpus)


def cgroup_cpu_quota(proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = CGROUP_ROOT) -> Optional[float]:
    """This process's cgroup CPU quota in CPUs (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us / cpu.cfs_period_us`);
    None where there is none or it cannot be read (never an error: the quota only caps a default). A container
    without its own cgroup namespace sees the host's path in /proc/self/cgroup but its own cgroup mounted at the
    root: both are looked at."""
    try:
        return _quota(_read(proc_cgroup) or "", root)
    except (ValueError, IndexError, ZeroDivisionError):
        return None


def _quota(proc_cgroup: str, root: Path) -> Optional[float]:
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: "0::/path"
            for folder in (root / path.lstrip("/"), root):
                limit = (_read(folder / "cpu.max") or "max").split()
                if limit[0] != "max":
                    return int(limit[0]) / int(limit[1])
        elif "cpu" in controllers.split(","):  # v1: "N:cpu,cpuacct:/path"
            for folder in (root / controllers / path.lstrip("/"), root / controllers):
                quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
                if quota and period and int(quota) > 0:
                    return int(quota) / int(period)
    return None


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def apply_cpu_threads(requested: Optional[int]) -> int:
    """Set torch's intra-op threads for this process; returns how many it now uses."""
    import torch

    torch.set_num_threads(cpu_threads(requested, quota=cgroup_cpu_quota()))
    return torch.get_num_threads()
