"""Where this process sits in its tensor-parallel group, and the variables each backend reads for it. Pure: no torch.

A serving group is `parallelism.nodes` hosts (a LeaderWorkerSet group: pod 0 the leader, 1.. its workers), each
holding `tensor_parallel_degree / nodes` TP ranks. How many processes a host runs depends on the framework:

- torch (the reference runner): one process per TP rank, so TP/nodes per host, the first of them the host's
  `serve` or `worker` command and the rest its local worker processes;
- nxdi, tnx: one process per host, whose Neuron runtime drives the host's TP/nodes NeuronCores and runs the
  collectives between hosts itself (NEURON_RT_ROOT_COMM_ID names the leader's rendezvous).

The group is found from LeaderWorkerSet's variables (LWS_LEADER_ADDRESS, LWS_GROUP_SIZE, LWS_WORKER_INDEX, which
its controller injects into every pod of a group) or from explicit values outside Kubernetes; `resolve` refuses
settings that cannot form the group, naming the variable and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from neuronmodel_runtime.config import env as names

#: The torch.distributed (gloo) rendezvous port on the leader; NEURONMODEL_GROUP_PORT changes it.
DEFAULT_GROUP_PORT = names.DEFAULT_GROUP_PORT
#: The Neuron runtime's rendezvous port on the leader (NEURON_RT_ROOT_COMM_ID), as AWS's multi-node examples use it.
NEURON_COMM_PORT = 63423
#: libfabric's settings for the Neuron runtime's collectives between hosts over EFA, which AWS's multi-node guide
#: requires (torch-neuronx setup-trn1-multi-node-execution.rst, "Application execution environment"; without
#: FI_EFA_FORK_SAFE on AL2's kernels the runtime disables multi-node, nrt-troubleshoot.rst). Defaults only: a value
#: the process already has (the pod's env, the image's ENV) wins.
EFA_DEFAULTS = {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1"}
#: Variables a launcher (torchrun, mpirun, AWS's multi-node scripts) sets, and the one value each may have in a
#: process that serves alone: another means two launchers disagree about the group.
LAUNCHER_VARIABLES = {"WORLD_SIZE": "1", "OMPI_COMM_WORLD_SIZE": "1", "RANK": "0", "NEURON_RANK_ID": "0"}


class TopologyError(ValueError):
    """The group cannot be formed; the message names the variable or field and what to change."""


class GroupLost(RuntimeError):
    """A peer of the group is gone, or a collective timed out: this process must exit non-zero."""


@dataclass(frozen=True)
class Topology:
    """One process of a TP group."""

    nodes: int  # hosts in the group
    node_rank: int  # this host's index: 0 = the leader (LWS_WORKER_INDEX)
    processes_per_node: int  # processes on each host
    local_rank: int  # this process on its host: 0 = the host's serve or worker command
    leader_address: str  # where every process reaches the leader host
    port: int  # the leader's torch.distributed rendezvous port

    @property
    def world_size(self) -> int:
        """Processes in the group (the torch.distributed world)."""
        return self.nodes * self.processes_per_node

    @property
    def rank(self) -> int:
        return self.node_rank * self.processes_per_node + self.local_rank

    @property
    def is_leader(self) -> bool:
        """Rank 0 runs the HTTP server and the scheduler, and broadcasts every step."""
        return self.rank == 0

    @property
    def init_method(self) -> str:
        return f"tcp://{self.leader_address}:{self.port}"


def processes_per_node(framework: str, tensor_parallel_degree: int, nodes: int) -> int:
    """torch: one process per TP rank; the Neuron runners: one per host."""
    return tensor_parallel_degree // nodes if framework == "torch" else 1


def _integer(env: Mapping[str, str], name: str) -> Optional[int]:
    value = env.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise TopologyError(f"{name}={value!r} is not an integer") from None


def resolve(framework: str, tensor_parallel_degree: int, nodes: int, env: Mapping[str, str], *,
            local_rank: int = 0, leader_address: Optional[str] = None, group_size: Optional[int] = None,
            worker_index: Optional[int] = None) -> Optional[Topology]:
    """This process's place in its group, or None when it serves alone (TP 1 on one host, or a Neuron runner on
    one host: its runtime drives every core itself).

    Explicit values win over LWS's variables. Raises:
        TopologyError: an LWS group size other than parallelism.nodes, a worker index outside the group, no
            leader address for a multi-host group, TP not divisible by the hosts, or launcher variables
            (WORLD_SIZE, RANK, ...) in a process that is not part of a group.
    """
    if nodes < 1 or tensor_parallel_degree % nodes:
        raise TopologyError(f"parallelism.tensor_parallel_degree {tensor_parallel_degree} is not divisible by "
                            f"parallelism.nodes {nodes}: each host holds TP/nodes ranks")
    per_node = processes_per_node(framework, tensor_parallel_degree, nodes)
    size = group_size if group_size is not None else _integer(env, names.LWS_GROUP_SIZE)
    index = worker_index if worker_index is not None else _integer(env, names.LWS_WORKER_INDEX)
    address = leader_address or env.get(names.LWS_LEADER_ADDRESS) or None
    port = _integer(env, names.GROUP_PORT) or DEFAULT_GROUP_PORT
    if nodes == 1 and per_node == 1:
        stray = [name for name, alone in LAUNCHER_VARIABLES.items() if env.get(name) not in (None, "", alone)]
        if (size or 1) > 1 or stray:
            found = ", ".join([f"{names.LWS_GROUP_SIZE}={size}"] * ((size or 1) > 1) +
                              [f"{name}={env[name]}" for name in stray])
            raise TopologyError(f"{found} in a process of a single-process model (parallelism.nodes 1, "
                                f"tensor_parallel_degree {tensor_parallel_degree} on framework {framework}): set "
                                "parallelism.nodes to the group's size, or unset the variables")
        return None
    if size is not None and size != nodes:
        raise TopologyError(f"{names.LWS_GROUP_SIZE}={size} but parallelism.nodes is {nodes}: the LeaderWorkerSet's "
                            "size and the config must agree (the operator sets both from spec.parallelism.nodes)")
    index = index or 0
    if not 0 <= index < nodes:
        raise TopologyError(f"{names.LWS_WORKER_INDEX}={index} is outside the group of {nodes} hosts (0..{nodes - 1})")
    if not 0 <= local_rank < per_node:
        raise TopologyError(f"local rank {local_rank} is outside this host's {per_node} processes")
    if address is None:
        if nodes > 1:
            raise TopologyError(f"parallelism.nodes is {nodes} but {names.LWS_LEADER_ADDRESS} is not set: a worker "
                                "reaches its leader there (LeaderWorkerSet sets it; outside Kubernetes pass "
                                "--leader-address)")
        address = "127.0.0.1"  # one host: its processes meet on loopback
    if not 0 < port < 65536:
        raise TopologyError(f"{names.GROUP_PORT}={port} is not a TCP port")
    return Topology(nodes=nodes, node_rank=index, processes_per_node=per_node, local_rank=local_rank,
                    leader_address=address, port=port)


def backend_env(framework: str, topology: Topology, tensor_parallel_degree: int,
                env: Mapping[str, str]) -> dict[str, str]:
    """What the process's libraries read, beside torch.distributed's own (MASTER_ADDR, MASTER_PORT, WORLD_SIZE,
    RANK, which every framework gets for the step broadcast), to be set over the process's environment `env`:

    - nxdi: NEURON_RT_ROOT_COMM_ID=<leader>:NEURON_COMM_PORT, the Neuron runtime's rendezvous; the host's ranks go to
      `load(start_rank_id=node_rank * TP/nodes, local_ranks_size=TP/nodes)` (neuron_nxdi.load_ranks);
    - tnx: NEURON_RT_ROOT_COMM_ID too, NEURON_RANK_ID (the host's index, 0 = the leader) and NEURON_LOCAL_TP
      (TP/nodes), which transformers-neuronx's NeuronConfig reads at construction;
    - both, across hosts: EFA_DEFAULTS, each unless `env` has it.
    """
    out = {"MASTER_ADDR": topology.leader_address, "MASTER_PORT": str(topology.port),
           "WORLD_SIZE": str(topology.world_size), "RANK": str(topology.rank)}
    if framework in ("nxdi", "tnx") and topology.nodes > 1:
        out["NEURON_RT_ROOT_COMM_ID"] = f"{topology.leader_address}:{NEURON_COMM_PORT}"
        out.update({name: value for name, value in EFA_DEFAULTS.items() if name not in env})
    if framework == "tnx" and topology.nodes > 1:
        out["NEURON_RANK_ID"] = str(topology.node_rank)
        out["NEURON_LOCAL_TP"] = str(tensor_parallel_degree // topology.nodes)
    return out


__all__ = ["DEFAULT_GROUP_PORT", "EFA_DEFAULTS", "GroupLost", "NEURON_COMM_PORT", "Topology", "TopologyError",
           "backend_env", "processes_per_node", "resolve"]
