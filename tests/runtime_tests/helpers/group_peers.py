"""Processes of a real two-rank gloo group, for the tests that need one (spawned: importable by name)."""

import os

from neuronmodel_runtime.config import load_config
from neuronmodel_runtime.distributed import channel
from neuronmodel_runtime.distributed.channel import INLINE_BYTES, Op, StepCodec
from neuronmodel_runtime.distributed.launch import rank_runner
from neuronmodel_runtime.distributed.topology import Topology
from neuronmodel_runtime.distributed.worker import serve_steps
from neuronmodel_runtime.runners.base import PrefillBatch


def message_peer(rank, port, out, row):
    """Rank 0 sends a short message, one longer than INLINE_BYTES and a heartbeat; rank 1 puts what it decoded."""
    channel.init_group(Topology(nodes=2, node_rank=rank, processes_per_node=1, local_rank=0,
                                leader_address="127.0.0.1", port=port), timeout_s=60)
    long_prompt = PrefillBatch(slots=[0], prompt_ids=[list(range(INLINE_BYTES // 2))], sampling=[row])
    messages = [(Op.RELEASE, 3), (Op.PREFILL, long_prompt), (Op.NOOP, None)]
    codec = StepCodec()
    if rank == 0:
        assert len(StepCodec().encode(Op.PREFILL, long_prompt)) > INLINE_BYTES
        for op, body in messages:
            channel.send(op, codec.encode(op, body))
    else:
        received = []
        for _ in messages:
            op, data = channel.receive(timeout_s=30)
            received.append((op, codec.decode(op, data)))
        out.put(received)
    channel.barrier()
    channel.leave_group()


def neuron_host(rank, port, out, fields, env, prompts, steps):
    """Host `rank` of a two-host Neuron group (one process per host), built by launch.rank_runner as `serve` and
    `worker` build it: the leader generates `steps` greedy tokens of `prompts` through its LeaderRunner and shuts the
    group down; the worker runs the leader's steps (worker.serve_steps). Each puts (rank, the ranks its library
    loaded, the inputs of every forward its library ran, the leader's tokens or the worker's exit status). The
    Neuron library is the contract fake on sys.path (spawn copies the parent's)."""
    from runtime_tests.helpers.runner_helpers import generate

    os.environ.update(env)
    config = load_config(None, fields, env={})
    topology = Topology(nodes=2, node_rank=rank, processes_per_node=1, local_rank=0, leader_address="127.0.0.1",
                        port=port)
    runner = rank_runner(fields["framework"], config, fields["model"], topology, worker_args=[])
    local = runner.local if rank == 0 else runner
    loaded = []
    shutdown = local.shutdown
    local.shutdown = lambda: (loaded.append(local.model), shutdown())  # the record outlives the runner's model
    if rank == 0:
        runner.load()
        result = generate(runner, list(range(len(prompts))), prompts, steps)
        runner.shutdown()
    else:
        result = serve_steps(runner)
    out.put((rank, loaded[0].loaded_ranks, loaded[0].step_inputs, result))
