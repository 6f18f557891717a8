"""`neuronmodel-runtime worker`: a non-leader rank of a group. It loads its shard, then runs every step the leader
broadcasts, on the same inputs, until the leader says SHUTDOWN (exit 0) or is gone (exit EXIT_GROUP_LOST).

Its outputs are dropped (the leader's are the group's). A step that fails here the way it fails on the leader
(bad input reaching the runner: the same code on the same inputs) is logged and the loop goes on, as the leader's
engine goes on; a failure of the group itself ends the process.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Callable

from neuronmodel_runtime.distributed import channel
from neuronmodel_runtime.distributed.channel import GroupLost, Op
from neuronmodel_runtime.distributed.leader import EXIT_GROUP_LOST, HEARTBEAT_S
from neuronmodel_runtime.runners.base import ModelRunner

log = logging.getLogger(__name__)

#: Seconds a worker waits for the leader's next message (it heartbeats every HEARTBEAT_S while idle).
LEADER_SILENCE_S = 10 * HEARTBEAT_S


def serve_steps(runner: ModelRunner, silence_s: float = LEADER_SILENCE_S) -> int:
    """Load, wait for the group, then run the leader's steps; returns the exit status."""
    try:
        runner.load()
        channel.barrier()
    except GroupLost as exc:
        log.error("%s; exiting with status %d", exc, EXIT_GROUP_LOST)
        return EXIT_GROUP_LOST
    log.info("worker ready: running the leader's steps")
    codec = channel.StepCodec()
    methods: dict[Op, Callable] = {Op.PREFILL: runner.prefill, Op.DECODE: runner.decode, Op.SCORE: runner.score,
                                   Op.RELEASE: runner.release}
    try:
        while True:
            op, data = channel.receive(timeout_s=silence_s)
            if op == Op.NOOP:
                continue
            if op == Op.SHUTDOWN:
                log.info("the leader shut the group down")
                channel.leave_group()
                return 0
            try:
                methods[op](codec.decode(op, data))
            except GroupLost:
                raise
            except Exception:  # the leader's engine saw the same failure on the same inputs and goes on
                log.exception("a %s step failed on this rank (as on the leader)", op.name.lower())
    except GroupLost as exc:
        log.error("%s; exiting with status %d", exc, EXIT_GROUP_LOST)
        return EXIT_GROUP_LOST
    finally:
        runner.shutdown()  # a lost group is not left: its peers are gone, and the process exits now


def run_worker(runner: ModelRunner) -> int:
    """The `worker` command: serve_steps, and on a lost group leave the process at once (os._exit), as the leader
    does. The interpreter's normal exit destroys the lost group's gloo process group while its threads still hold
    the broken connections, and that aborts the process now and then (std::terminate: exit status -6, not 3)."""
    status = serve_steps(runner)
    if status == EXIT_GROUP_LOST:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


__all__ = ["LEADER_SILENCE_S", "run_worker", "serve_steps"]
