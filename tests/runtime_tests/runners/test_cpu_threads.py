"""`cpu_threads`: the torch runner's intra-op threads are the CPUs the process may use (its affinity, at most its
cgroup's CPU quota) unless the config says how many."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from neuronmodel_runtime.runners.cpu_threads import cgroup_cpu_quota, cpu_threads


@pytest.mark.parametrize("requested, available, quota, expected", [
    (None, 1, None, 1), (None, 2, None, 2), (None, 16, None, 16), (3, 2, None, 3), (1, 64, None, 1),
    (None, 64, 2.0, 2), (None, 64, 2.5, 2), (None, 2, 8.0, 2), (None, 64, 0.5, 1), (4, 64, 2.0, 4),
])
def test_threads_are_the_configured_count_else_the_cpus_capped_by_the_quota(requested, available, quota, expected):
    assert cpu_threads(requested, available, quota) == expected


def test_the_default_follows_the_processes_affinity_not_the_hosts_cores():
    """A container limited to some CPUs (cpuset) gets its share, not the node's core count."""
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))});"
            "from neuronmodel_runtime.runners.cpu_threads import apply_cpu_threads; print(apply_cpu_threads(None))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "1\n"


def _tree(tmp_path: Path, proc_cgroup: str, files: dict[str, str]) -> tuple[Path, Path]:
    """A fake /proc/self/cgroup and /sys/fs/cgroup holding `files` (path under the root -> content), in the
    kernel's formats."""
    (tmp_path / "cgroup").write_text(proc_cgroup)
    for name, content in files.items():
        (tmp_path / "fs" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fs" / name).write_text(content)
    return tmp_path / "cgroup", tmp_path / "fs"


POD = "kubepods.slice/kubepods-burstable.slice/cri-containerd-1a2b.scope"


@pytest.mark.parametrize("proc_cgroup, files, quota", [
    # cgroup v2, a pod with a CPU limit of 2 (`resources.limits.cpu: 2`), seen through its own namespace
    ("0::/\n", {"cpu.max": "200000 100000\n"}, 2.0),
    # v2 without a cgroup namespace: the host's path
    (f"0::/{POD}\n", {f"{POD}/cpu.max": "150000 100000\n"}, 1.5),
    # v2 without a limit
    ("0::/\n", {"cpu.max": "max 100000\n"}, None),
    # v1 (this machine's layout): cpu,cpuacct joined, a limit of 4
    (f"4:memory:/{POD}\n2:cpu,cpuacct:/{POD}\n", {f"cpu,cpuacct/{POD}/cpu.cfs_quota_us": "400000\n",
                                                  f"cpu,cpuacct/{POD}/cpu.cfs_period_us": "100000\n"}, 4.0),
    # v1 inside a container without its namespace: the host's path in /proc, its own cgroup at the mount's root
    (f"3:cpu:/{POD}\n", {"cpu/cpu.cfs_quota_us": "50000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 0.5),
    # v1 without a limit (-1), and a host with no cgroup files at all
    ("2:cpu,cpuacct:/\n", {"cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, None),
    ("0::/user.slice\n", {}, None),
])
def test_the_cgroup_quota_is_read_as_the_kernel_writes_it(tmp_path, proc_cgroup, files, quota):
    assert cgroup_cpu_quota(*_tree(tmp_path, proc_cgroup, files)) == quota


@pytest.mark.parametrize("content", ["garbage\n", "200000\n", "x 100000\n", "100000 0\n"])
def test_an_unreadable_quota_is_no_quota_not_an_error(tmp_path, content):
    assert cgroup_cpu_quota(*_tree(tmp_path, "0::/\n", {"cpu.max": content})) is None
