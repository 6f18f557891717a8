"""`cpu_threads`: the torch runner's intra-op threads keep a CPU for the server unless the config says how many."""

from __future__ import annotations

import subprocess
import sys

import pytest

from neuronmodel_runtime.runners.cpu_threads import cpu_threads


@pytest.mark.parametrize("requested, available, expected", [
    (None, 1, 1), (None, 2, 1), (None, 16, 15), (3, 2, 3), (1, 64, 1),
])
def test_threads_are_the_configured_count_else_the_cpus_less_one(requested, available, expected):
    assert cpu_threads(requested, available) == expected


def test_the_default_follows_the_processes_affinity_not_the_hosts_cores():
    """A container limited to some CPUs (cpuset) gets its share, not the node's core count."""
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))});"
            "from neuronmodel_runtime.runners.cpu_threads import apply_cpu_threads; print(apply_cpu_threads(None))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "1\n"
