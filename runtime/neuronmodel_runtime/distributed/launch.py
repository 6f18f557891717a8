"""Starting one rank of a group: its backend's variables, its host's further processes, the group, its runner.

`neuronmodel-runtime serve` on the leader host and `neuronmodel-runtime worker` on the others both come here when
`topology.resolve` finds a group. On a host that runs several processes (the torch runner: one per TP rank), the
host's command starts the others as `neuronmodel-runtime worker --local-rank I` with its own arguments and
environment; they end with the group (a lost group ends every rank).
"""

from __future__ import annotations

import atexit
import logging
import os
import subprocess
import sys
from typing import Callable, Mapping, Optional, Sequence

from neuronmodel_runtime.config import RuntimeConfig
from neuronmodel_runtime.distributed.topology import Topology, backend_env, resolve
from neuronmodel_runtime.runners.base import ModelRunner

log = logging.getLogger(__name__)


def topology_of(config: RuntimeConfig, framework: str, env: Mapping[str, str], *, local_rank: int = 0,
                leader_address: Optional[str] = None, group_size: Optional[int] = None,
                worker_index: Optional[int] = None) -> Optional[Topology]:
    """This process's place in its group (None: it serves alone); TopologyError names what is inconsistent."""
    p = config.parallelism
    return resolve(framework, p.tensor_parallel_degree, p.nodes, env, local_rank=local_rank,
                   leader_address=leader_address, group_size=group_size, worker_index=worker_index)


def start_local_ranks(topology: Topology, worker_args: Sequence[str]) -> list[subprocess.Popen]:
    """The host's processes 1.. (only its process 0 calls this): `neuronmodel-runtime worker ... --local-rank I`."""
    children = []
    for local_rank in range(1, topology.processes_per_node):
        argv = [sys.executable, "-m", "neuronmodel_runtime.cli", "worker", *worker_args, "--local-rank",
                str(local_rank)]
        children.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL))
    log.info("started %d local rank(s) of host %d: pids %s", len(children), topology.node_rank,
             [c.pid for c in children])

    def stop() -> None:
        for child in children:
            if child.poll() is None:
                child.terminate()

    atexit.register(stop)
    return children


def rank_runner(framework: str, config: RuntimeConfig, model_path: str, topology: Topology,
                worker_args: Sequence[str], on_lost: Callable[[str], None] = lambda why: None) -> ModelRunner:
    """Start the host's further processes (on its process 0, with `worker_args`), join the group (after setting
    what the backend reads) and build this rank's runner, not loaded: on the leader a `LeaderRunner` around its
    own, which broadcasts every step."""
    from neuronmodel_runtime.distributed import channel
    from neuronmodel_runtime.distributed.leader import LeaderRunner
    from neuronmodel_runtime.runners.registry import create_runner

    if topology.local_rank == 0 and topology.processes_per_node > 1:
        start_local_ranks(topology, worker_args)
    os.environ.update(backend_env(framework, topology, config.parallelism.tensor_parallel_degree, os.environ))
    channel.init_group(topology)
    if framework == "torch":
        import torch

        from neuronmodel_runtime.runners.tensor_parallel import TensorParallel

        # the host's ranks share its cores: each its own share, not every core each (they would contend)
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // topology.processes_per_node))

        local = create_runner(framework, config, model_path, tensor_parallel=TensorParallel(
            rank=topology.rank, world=topology.world_size, reduce=channel.all_reduce))
    elif framework == "nxdi":
        local = create_runner(framework, config, model_path, node_rank=topology.node_rank)
    else:  # tnx: its NeuronConfig reads the host's ranks from NEURON_RANK_ID / NEURON_LOCAL_TP (backend_env)
        local = create_runner(framework, config, model_path)
    return LeaderRunner(local, topology, on_lost) if topology.is_leader else local


__all__ = ["rank_runner", "topology_of"]
