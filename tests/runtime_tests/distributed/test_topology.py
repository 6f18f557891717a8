"""The group from LeaderWorkerSet's variables (or explicit values), and the variables each backend reads: the
Neuron names are the release sources' (neuron-apis.md: NxDI's load(start_rank_id, local_ranks_size), TNx's
NeuronConfig reading NEURON_RANK_ID / NEURON_LOCAL_TP, NEURON_RT_ROOT_COMM_ID=<leader>:<port> on every node)."""

import pytest

from neuronmodel_runtime.distributed.topology import (DEFAULT_GROUP_PORT, NEURON_COMM_PORT, TopologyError,
                                                      backend_env, resolve)
from neuronmodel_runtime.runners.neuron_nxdi import load_ranks
from runtime_tests.helpers.fakes import make_config

LWS = {"LWS_LEADER_ADDRESS": "m-lws-0.m-lws.team", "LWS_GROUP_SIZE": "2"}


def test_one_process_serves_alone():
    assert resolve("torch", 1, 1, {}) is None
    assert resolve("nxdi", 32, 1, {}) is None, "one Neuron host: its runtime drives every core itself"
    assert resolve("torch", 1, 1, {"WORLD_SIZE": "1", "RANK": "0"}) is None


def test_lws_variables_place_each_pod_of_a_two_node_neuron_group():
    leader = resolve("nxdi", 64, 2, {**LWS, "LWS_WORKER_INDEX": "0"})
    worker = resolve("nxdi", 64, 2, {**LWS, "LWS_WORKER_INDEX": "1"})
    assert (leader.world_size, leader.rank, leader.is_leader) == (2, 0, True)
    assert (worker.world_size, worker.rank, worker.is_leader, worker.node_rank) == (2, 1, False, 1)
    assert worker.init_method == f"tcp://m-lws-0.m-lws.team:{DEFAULT_GROUP_PORT}"
    config = make_config(**{"parallelism.tensor_parallel_degree": 64, "parallelism.nodes": 2})
    assert load_ranks(config, worker.node_rank) == {"start_rank_id": 32, "local_ranks_size": 32}


def test_the_torch_runner_runs_one_process_per_rank_on_each_host():
    one_host = resolve("torch", 2, 1, {})
    assert (one_host.world_size, one_host.processes_per_node, one_host.leader_address) == (2, 2, "127.0.0.1")
    second = resolve("torch", 4, 2, {**LWS, "LWS_WORKER_INDEX": "1", "NEURONMODEL_GROUP_PORT": "29999"}, local_rank=1)
    assert (second.world_size, second.rank, second.port) == (4, 3, 29999)


def test_explicit_values_win_over_lws():
    t = resolve("torch", 2, 2, {**LWS, "LWS_WORKER_INDEX": "0"}, leader_address="10.0.0.5", worker_index=1)
    assert (t.leader_address, t.node_rank) == ("10.0.0.5", 1)


@pytest.mark.parametrize("args, env, message", [
    (("torch", 3, 2), {}, "tensor_parallel_degree 3 is not divisible by parallelism.nodes 2"),
    (("nxdi", 64, 2), {**LWS, "LWS_GROUP_SIZE": "4"}, "LWS_GROUP_SIZE=4 but parallelism.nodes is 2"),
    (("nxdi", 64, 2), {**LWS, "LWS_WORKER_INDEX": "2"}, r"LWS_WORKER_INDEX=2 is outside the group of 2 hosts"),
    (("nxdi", 64, 2), {"LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "1"}, "LWS_LEADER_ADDRESS is not set"),
    (("torch", 1, 1), {"WORLD_SIZE": "4"}, "WORLD_SIZE=4 in a process of a single-process model"),
    (("nxdi", 8, 1), {"NEURON_RANK_ID": "1"}, "NEURON_RANK_ID=1 in a process of a single-process model"),
    (("torch", 1, 1), {"LWS_GROUP_SIZE": "2"}, "LWS_GROUP_SIZE=2 in a process of a single-process model"),
    (("nxdi", 64, 2), {**LWS, "LWS_WORKER_INDEX": "one"}, "LWS_WORKER_INDEX='one' is not an integer"),
    (("nxdi", 64, 2), {**LWS, "NEURONMODEL_GROUP_PORT": "70000"}, "NEURONMODEL_GROUP_PORT=70000 is not a TCP port"),
])
def test_inconsistent_settings_are_refused_naming_the_variable(args, env, message):
    with pytest.raises(TopologyError, match=message):
        resolve(*args, env)


def test_each_backend_gets_its_own_variables():
    worker = resolve("tnx", 64, 2, {**LWS, "LWS_WORKER_INDEX": "1"})
    tnx = backend_env("tnx", worker, 64, {})
    assert tnx == {"MASTER_ADDR": "m-lws-0.m-lws.team", "MASTER_PORT": str(DEFAULT_GROUP_PORT), "WORLD_SIZE": "2",
                   "RANK": "1", "NEURON_RT_ROOT_COMM_ID": f"m-lws-0.m-lws.team:{NEURON_COMM_PORT}",
                   "NEURON_RANK_ID": "1", "NEURON_LOCAL_TP": "32", **EFA}
    nxdi = backend_env("nxdi", worker, 64, {})
    assert nxdi["NEURON_RT_ROOT_COMM_ID"] == tnx["NEURON_RT_ROOT_COMM_ID"]
    assert "NEURON_RANK_ID" not in nxdi and "NEURON_LOCAL_TP" not in nxdi, "NxDI takes its ranks in load()"
    torch_env = backend_env("torch", resolve("torch", 2, 1, {}), 2, {})
    assert set(torch_env) == {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"}, "no Neuron runtime to configure"


#: What AWS's multi-node guide requires of a Neuron process whose collectives cross hosts (setup-trn1-multi-node-
#: execution.rst, "Application execution environment").
EFA = {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1"}


@pytest.mark.parametrize("framework", ["nxdi", "tnx"])
def test_neuron_hosts_of_a_group_get_libfabrics_efa_settings_unless_their_environment_has_them(framework):
    worker = resolve(framework, 64, 2, {**LWS, "LWS_WORKER_INDEX": "1"})
    assert EFA.items() <= backend_env(framework, worker, 64, {}).items()
    # the pod's env or the image's ENV wins: only what the process lacks is set
    own = backend_env(framework, worker, 64, {"FI_PROVIDER": "tcp", "FI_EFA_FORK_SAFE": "0"})
    assert "FI_PROVIDER" not in own and "FI_EFA_FORK_SAFE" not in own and own["FI_EFA_USE_DEVICE_RDMA"] == "1"
    # torch's group talks gloo over TCP (a Neuron runner on one host has no group: resolve gives None)
    assert not set(EFA) & set(backend_env("torch", resolve("torch", 4, 2, LWS), 4, {}))
