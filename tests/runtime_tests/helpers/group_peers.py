"""Processes of a real two-rank gloo group, for the tests that need one (spawned: importable by name)."""

from neuronmodel_runtime.distributed import channel
from neuronmodel_runtime.distributed.channel import INLINE_BYTES, Op, StepCodec
from neuronmodel_runtime.distributed.topology import Topology
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
