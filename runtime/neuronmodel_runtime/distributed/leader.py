"""Rank 0's runner in a multi-process group: every step is broadcast to the workers, then run here.

`LeaderRunner` wraps the leader's own runner (rank 0's shard) behind the same runner contract, so the engine,
the scheduler and the HTTP server do not know the model spans processes. Only rank 0's outputs are used: the
workers run the same step on the same inputs for their collectives, and the next step's inputs carry the tokens
rank 0 chose. So sampling, scored speculation's verification and the draft model run on rank 0 alone, and a
per-request seed gives exactly the tokens it gives on one process.

A heartbeat thread sends a NOOP while the engine is idle. When the group is lost (a send fails, a collective
inside a step fails), `on_lost` is called once with the reason (the server turns unready) and the process exits
non-zero `EXIT_DELAY_S` later, after the failed requests' errors went out: the group cannot continue, and
LeaderWorkerSet's RecreateGroupOnPodRestart brings up a new one.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable, Optional, Sequence

from neuronmodel_runtime.distributed import channel
from neuronmodel_runtime.distributed.channel import GroupLost, Op
from neuronmodel_runtime.distributed.topology import Topology
from neuronmodel_runtime.runners.base import (DecodeBatch, ModelRunner, PrefillBatch, RunnerCapabilities,
                                              RunnerCapacity, ScoreBatch, StepOutput)

log = logging.getLogger(__name__)

#: Seconds between heartbeats while no step runs.
HEARTBEAT_S = 1.0
#: Seconds between the loss of the group and the process's exit (the engine fails the step's requests meanwhile).
EXIT_DELAY_S = 1.0
#: The exit status of a process whose group was lost.
EXIT_GROUP_LOST = 3


class LeaderRunner(ModelRunner):
    """The leader's runner: broadcasts each call, then runs it on its own shard."""

    def __init__(self, local: ModelRunner, topology: Topology, on_lost: Callable[[str], None] = lambda why: None,
                 heartbeat_s: float = HEARTBEAT_S):
        self.local = local
        self.topology = topology
        self.framework = local.framework
        self._on_lost = on_lost
        self._heartbeat_s = heartbeat_s
        self._lock = threading.Lock()  # one message (and the step after it) at a time on the group
        self._codec = channel.StepCodec()  # the workers' codecs hold the same per-slot rows
        self._last_send = time.monotonic()
        self._lost: Optional[str] = None
        self._stop = threading.Event()

    @property
    def artifacts(self) -> Any:  # type: ignore[override]
        return self.local.artifacts

    @property
    def lost(self) -> Optional[str]:
        """Why the group was lost, None while it holds."""
        return self._lost

    def load(self) -> None:
        """Load rank 0's shard, wait for every rank to have loaded its own, then start the heartbeat."""
        self.local.load()
        self._guarded(channel.barrier)
        threading.Thread(target=self._beat, name="group-heartbeat", daemon=True).start()

    def capacity(self) -> RunnerCapacity:
        return self.local.capacity()

    def capabilities(self) -> RunnerCapabilities:
        return self.local.capabilities()

    def prefill(self, batch: PrefillBatch) -> StepOutput:
        return self._step(Op.PREFILL, batch, self.local.prefill)

    def decode(self, batch: DecodeBatch) -> StepOutput:
        return self._step(Op.DECODE, batch, self.local.decode)

    def score(self, batch: ScoreBatch) -> Any:
        return self._step(Op.SCORE, batch, self.local.score)

    def release(self, slot: int) -> None:
        self._step(Op.RELEASE, slot, self.local.release)

    def slot_generators(self, slots: Sequence[int]) -> list[Any]:
        return self.local.slot_generators(slots)

    def draft_model(self) -> Any:
        return self.local.draft_model()

    def info(self) -> dict[str, Any]:
        t = self.topology
        return {**self.local.info(), "group": {"world_size": t.world_size, "nodes": t.nodes,
                                               "processes_per_node": t.processes_per_node,
                                               "leader": f"{t.leader_address}:{t.port}"}}

    def shutdown(self) -> None:
        """Tell the workers to exit, then leave the group."""
        self._stop.set()
        if self._lost is None:
            with self._lock:
                try:
                    channel.send(Op.SHUTDOWN)
                except GroupLost as exc:
                    log.warning("the group was gone at shutdown: %s", exc)
        self.local.shutdown()
        channel.leave_group()

    # --- the group ---------------------------------------------------------------------------------------------

    def _step(self, op: Op, body: Any, run: Callable[[Any], Any]) -> Any:
        if self._lost is not None:
            raise GroupLost(self._lost)
        with self._lock:  # encoded in the order of the sends: the codecs' rows follow the message sequence
            self._guarded(channel.send, op, self._codec.encode(op, body))
            self._last_send = time.monotonic()
            try:
                return run(body)
            except GroupLost as exc:
                self._lose(str(exc))
                raise

    def _guarded(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except GroupLost as exc:
            self._lose(str(exc))
            raise

    def _beat(self) -> None:
        while not self._stop.wait(self._heartbeat_s / 2):
            if self._lost is not None:
                return
            if time.monotonic() - self._last_send < self._heartbeat_s or not self._lock.acquire(blocking=False):
                continue  # a step is running, or one ran just now: the workers heard from the leader
            try:
                channel.send(Op.NOOP)
                self._last_send = time.monotonic()
            except GroupLost as exc:
                self._lose(str(exc))
            finally:
                self._lock.release()

    def _lose(self, why: str) -> None:
        if self._lost is not None:
            return
        self._lost = why
        log.error("the tensor-parallel group is lost: %s; exiting with status %d in %.0f s (LeaderWorkerSet "
                  "recreates the group)", why, EXIT_GROUP_LOST, EXIT_DELAY_S)
        self._on_lost(why)
        threading.Timer(EXIT_DELAY_S, os._exit, (EXIT_GROUP_LOST,)).start()


__all__ = ["EXIT_GROUP_LOST", "HEARTBEAT_S", "LeaderRunner"]
