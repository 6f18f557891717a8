"""How many intra-op threads the torch reference runner takes (`cpu_threads`).

More compute threads than free cores is the costly mistake on a small host: OpenMP's threads spin in their barriers
while the HTTP server (or another process) holds a core, and every op waits for the descheduled one. Measured on 2
busy cores with the tiny model: a decode step took 43 ms with 2 threads and 2 ms with 1. So by default one CPU of
those this process may use is kept for the server, as vLLM's CPU build keeps one for its front end.
"""

from __future__ import annotations

import os
from typing import Optional


def cpu_threads(requested: Optional[int], available: Optional[int] = None) -> int:
    """`requested`, else the CPUs this process may run on (`available`: its affinity) less one, at least one."""
    if requested is not None:
        return requested
    cpus = available if available is not None else len(os.sched_getaffinity(0))
    return max(1, cpus - 1)


def apply_cpu_threads(requested: Optional[int]) -> int:
    """Set torch's intra-op threads for this process; returns how many it now uses."""
    import torch

    torch.set_num_threads(cpu_threads(requested))
    return torch.get_num_threads()
