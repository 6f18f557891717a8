"""The Neuron runners' multi-node variables against what the release sources read, and two hosts of an NxDI group
(real processes, the leader's LeaderRunner broadcasting to a worker's serve loop, over the contract fake) running
the same steps on their own ranks.

Sources: NxDI examples/multi_node.md and inference_demo.py (aws-neuron/neuronx-distributed-inference at ef2731e):
one process per node, the group's --tp-degree on every node, --local_ranks_size TP/nodes, --start_rank_id
node_rank * local_ranks_size, NEURON_RT_ROOT_COMM_ID=<leader>:63423. transformers-neuronx config.py (at 1ade6d7):
NeuronConfig reads NEURON_RANK_ID (default 0) and NEURON_LOCAL_TP (default: tp_degree) at construction; the host's
devices start at rank_id * local_tp (get_g_start_device_id)."""

from __future__ import annotations

import multiprocessing
import socket

import pytest

from neuronmodel_runtime.config import load_config
from neuronmodel_runtime.distributed.topology import NEURON_COMM_PORT, backend_env, resolve
from neuronmodel_runtime.runners.neuron_nxdi import NxdiRunner, load_ranks
from neuronmodel_runtime.runners.neuron_tnx import multi_node_error
from neuronmodel_runtime.runners.nxdi_config import neuron_config_kwargs
from runtime_tests.helpers.fake_neuron.install import install_nxdi, install_tnx
from runtime_tests.helpers.fake_neuron.tiny import TARGET
from runtime_tests.helpers.group_peers import neuron_host
from runtime_tests.helpers.runner_helpers import generate

LWS = {"LWS_LEADER_ADDRESS": "10.0.0.1", "LWS_GROUP_SIZE": "2"}


def host(framework, index, tp=64):
    """Host `index` of a group of two, as LeaderWorkerSet's variables place it: (config, topology, backend env)."""
    config = load_config(None, {"model": str(TARGET), "framework": framework,
                                "parallelism": {"tensor_parallel_degree": tp, "nodes": 2}}, env={})
    topology = resolve(framework, tp, 2, {**LWS, "LWS_WORKER_INDEX": str(index)})
    return config, topology, backend_env(framework, topology, tp, {})


def test_nxdi_hosts_get_the_variables_and_ranks_of_nxdis_multi_node_example():
    """multi_node.md's two trn1 nodes: TP 64, --local_ranks_size 32, --start_rank_id 0 and 32."""
    for index in (0, 1):
        config, topology, env = host("nxdi", index)
        assert topology.processes_per_node == 1 and topology.node_rank == index
        assert env["NEURON_RT_ROOT_COMM_ID"] == f"10.0.0.1:{NEURON_COMM_PORT}" == "10.0.0.1:63423"
        assert not {"NEURON_RANK_ID", "NEURON_LOCAL_TP"} & set(env)  # TNx's variables; NxDI takes arguments
        assert (env["WORLD_SIZE"], env["RANK"]) == ("2", str(index))  # the gloo group of the step broadcast
        assert load_ranks(config, topology.node_rank) == {"start_rank_id": 32 * index, "local_ranks_size": 32}
        kwargs = neuron_config_kwargs(config, env={})
        assert (kwargs["tp_degree"], kwargs["local_ranks_size"]) == (64, 32) and "start_rank_id" not in kwargs


def test_tnx_hosts_get_the_variables_its_neuron_config_reads(monkeypatch, tmp_path):
    tnx = install_tnx(monkeypatch, tmp_path)
    for index in (0, 1):
        config, _, env = host("tnx", index)
        assert (env["NEURON_RANK_ID"], env["NEURON_LOCAL_TP"]) == (str(index), "32")
        assert env["NEURON_RT_ROOT_COMM_ID"] == "10.0.0.1:63423"
        assert multi_node_error(config, env) is None  # what backend_env sets is what the runner accepts
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        neuron_config = tnx.config.NeuronConfig()
        assert (neuron_config.rank_id, neuron_config.local_tp) == (index, 32)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_nxdi_hosts_run_the_leaders_steps_each_on_its_own_ranks(monkeypatch, tmp_path):
    install_nxdi(monkeypatch, "0.9.17334", tmp_path / "site")
    env = {"NEURONMODEL_CACHE": str(tmp_path / "cache"), "NEURONMODEL_GROUP_PORT": str(free_port())}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    fields = {"model": str(TARGET), "framework": "nxdi", "max_num_seqs": 2, "max_model_len": 64,
              "max_context_length": 32, "dtype": "float32", "parallelism": {"tensor_parallel_degree": 4, "nodes": 2}}
    NxdiRunner(load_config(None, fields, env={}), str(TARGET)).compile()  # one compile, before the hosts start
    prompts = [[48, 911, 7, 301], [3, 2048, 77]]
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    port = int(env["NEURONMODEL_GROUP_PORT"])
    hosts = [ctx.Process(target=neuron_host, args=(rank, port, out, fields, env, prompts, 5)) for rank in (0, 1)]
    for process in hosts:
        process.start()
    try:
        results = dict((rank, rest) for rank, *rest in (out.get(timeout=180) for _ in hosts))
    finally:
        for process in hosts:
            process.join(60)
            if process.is_alive():
                process.kill()
    (leader_ranks, leader_steps, tokens), (worker_ranks, worker_steps, status) = results[0], results[1]
    assert (leader_ranks, worker_ranks, status) == ([0, 1], [2, 3], 0)
    assert len(leader_steps) == 2 + 4 and worker_steps == leader_steps  # two prompts, then four decode steps
    single = NxdiRunner(load_config(None, {**fields, "parallelism": {}}, env={}), str(TARGET))
    single.load()
    assert tokens == generate(single, [0, 1], prompts, 5)
