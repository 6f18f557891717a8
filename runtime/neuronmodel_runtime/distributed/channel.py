"""The group's torch.distributed (gloo) process group and the leader's step broadcast over it.

Every rank runs the same runner step on the same inputs, so that every collective inside it (the reference
runner's all-reduces; on Neuron, the runtime's own) meets its peers. The leader sends each step as one broadcast
from rank 0 of one fixed-size uint8 tensor: a 16-byte header (op, length) and the batch as compact JSON, inline up
to INLINE_BYTES, the rest of a longer message (a prefill of long prompts) in a second broadcast. A slot's sampling
row travels only when it differs from the last one sent for that slot (`StepCodec`): a decode step at batch 64 is
then its slots, tokens and positions, about 2 KB. One tensor per step, not a message per field
(`bench/multinode.py` measures it: `broadcast_ms_per_step`). A NOOP is the
leader's heartbeat while idle, so that a worker notices a lost leader (`receive`'s timeout) and the leader a lost
worker (its next send fails) within seconds, and SHUTDOWN ends the workers' loop.

Any failure of the group (a peer gone, a timeout) is a `GroupLost`: the group cannot continue, and the process
exits non-zero so that LeaderWorkerSet recreates the whole group.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
from datetime import timedelta
from typing import Any, Optional

import torch
import torch.distributed as dist

from neuronmodel_runtime.distributed.topology import GroupLost, Topology
from neuronmodel_runtime.runners.base import DecodeBatch, PrefillBatch, ScoreBatch
from neuronmodel_runtime.sampling.params import RowSampling

log = logging.getLogger(__name__)

#: Message bytes carried by the step's first (fixed-size) broadcast.
INLINE_BYTES = 4 * 1024
_HEADER = 16  # op, length: two little-endian int64

#: Seconds a collective may wait for its peers: a model's load on every rank (the barrier after it) fits in it.
#: A dead peer is found sooner: its closed connection fails the next send or receive at once.
GROUP_TIMEOUT_S = 1800.0


class Op(enum.IntEnum):
    NOOP = 0  # the leader's heartbeat
    PREFILL = 1
    DECODE = 2
    SCORE = 3
    RELEASE = 4
    SHUTDOWN = 5


_BATCHES = {Op.PREFILL: PrefillBatch, Op.DECODE: DecodeBatch, Op.SCORE: ScoreBatch}
#: RowSampling fields a worker's step does without: the penalties' token history (a worker's sampled tokens are
#: never used: the next step's inputs carry the leader's), which would grow every message with the sequence.
_LOCAL_ONLY = ("prompt_ids", "output_ids")


def _shallow(obj: Any, leave_out: tuple[str, ...] = ()) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.name not in leave_out}


def _row(fields: dict[str, Any]) -> RowSampling:
    return RowSampling(**{**fields, "logit_bias": tuple(map(tuple, fields["logit_bias"])),
                          "masked_token_ids": tuple(fields["masked_token_ids"])})


class StepCodec:
    """A step's message body, both ways: a batch dataclass (PREFILL, DECODE, SCORE), a slot (RELEASE), or nothing.

    Each end keeps the sampling row last sent for each slot; a row equal to it (RowSampling compares without its
    token history) travels as null, and RELEASE forgets the slot. The leader's codec encodes every message it
    sends and each worker's decodes every message it receives, in the same order, so both hold the same rows.
    Rows arrive without their token history (`_LOCAL_ONLY`).
    """

    def __init__(self) -> None:
        self._rows: dict[int, RowSampling] = {}

    def encode(self, op: Op, body: Any = None) -> bytes:
        if op in _BATCHES:  # field by field: dataclasses.asdict would deep-copy every token list first
            fields = _shallow(body)
            if "sampling" in fields:
                fields["sampling"] = [self._changed(slot, row) for slot, row in zip(body.slots, body.sampling)]
            return json.dumps(fields, separators=(",", ":")).encode()
        if op == Op.RELEASE:
            self._rows.pop(int(body), None)
            return str(int(body)).encode()
        return b""

    def decode(self, op: Op, data: bytes) -> Any:
        if op in _BATCHES:
            fields = json.loads(data)
            if "sampling" in fields:
                fields["sampling"] = [self._known(slot, row) for slot, row in zip(fields["slots"], fields["sampling"])]
            return _BATCHES[op](**fields)
        if op == Op.RELEASE:
            self._rows.pop(int(data), None)
            return int(data)
        return None

    def _changed(self, slot: int, row: RowSampling) -> Optional[dict[str, Any]]:
        if self._rows.get(slot) == row:
            return None
        self._rows[slot] = row
        return _shallow(row, _LOCAL_ONLY)

    def _known(self, slot: int, fields: Optional[dict[str, Any]]) -> RowSampling:
        if fields is not None:
            self._rows[slot] = _row(fields)
        return self._rows[slot]


def init_group(topology: Topology, timeout_s: float = GROUP_TIMEOUT_S) -> None:
    """Join the group's gloo process group at the leader's rendezvous (blocks until every rank has joined)."""
    log.info("joining the group at %s as rank %d of %d", topology.init_method, topology.rank, topology.world_size)
    try:
        dist.init_process_group("gloo", init_method=topology.init_method, world_size=topology.world_size,
                                rank=topology.rank, timeout=timedelta(seconds=timeout_s))
    except Exception as exc:
        raise GroupLost(f"could not join the group at {topology.init_method} as rank {topology.rank}: {exc}") from exc


def barrier() -> None:
    """Every rank loaded its model (the leader turns ready only then)."""
    try:
        dist.barrier()
    except Exception as exc:
        raise GroupLost(f"a rank of the group failed before it was ready: {exc}") from exc


def all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Sum `tensor` over the group, in place (the tensor-parallel reference runner's collective)."""
    try:
        dist.all_reduce(tensor)
    except Exception as exc:
        raise GroupLost(f"an all-reduce of the group failed: {exc}") from exc
    return tensor


def leave_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def send(op: Op, data: bytes = b"") -> None:
    """Leader: broadcast one message to every worker."""
    first = bytearray(_HEADER + INLINE_BYTES)
    first[:_HEADER] = int(op).to_bytes(8, "little") + len(data).to_bytes(8, "little")
    first[_HEADER:_HEADER + min(len(data), INLINE_BYTES)] = data[:INLINE_BYTES]
    try:
        dist.broadcast(torch.frombuffer(first, dtype=torch.uint8), src=0)
        if len(data) > INLINE_BYTES:
            dist.broadcast(torch.frombuffer(bytearray(data[INLINE_BYTES:]), dtype=torch.uint8), src=0)
    except Exception as exc:
        raise GroupLost(f"a worker of the group is gone ({exc})") from exc


def receive(timeout_s: Optional[float] = None) -> tuple[Op, bytes]:
    """Worker: the leader's next message; GroupLost when the leader is gone or silent for `timeout_s`."""
    first = torch.empty(_HEADER + INLINE_BYTES, dtype=torch.uint8)
    try:
        work = dist.broadcast(first, src=0, async_op=True)
        if timeout_s is None:
            work.wait()
        else:
            work.wait(timeout=timedelta(seconds=timeout_s))
        raw = first.numpy().tobytes()
        op, size = Op(int.from_bytes(raw[:8], "little")), int.from_bytes(raw[8:_HEADER], "little")
        data = raw[_HEADER:_HEADER + min(size, INLINE_BYTES)]
        if size > INLINE_BYTES:
            rest = torch.empty(size - INLINE_BYTES, dtype=torch.uint8)
            dist.broadcast(rest, src=0)
            data += rest.numpy().tobytes()
    except Exception as exc:
        raise GroupLost(f"the leader of the group is gone ({exc})") from exc
    return op, data


__all__ = ["GROUP_TIMEOUT_S", "GroupLost", "INLINE_BYTES", "Op", "StepCodec", "all_reduce", "barrier", "init_group",
           "leave_group", "receive", "send"]
