"""Continuous batching over fixed slots.

Each step, every running request decodes (running requests are never starved by arrivals), and waiting
requests are admitted first-come-first-served into free slots while the step's prefill token budget lasts.
A slot is held from admission to finish and freed at once, so the next waiting request takes it in the
next step. No preemption: a slot owns its KV line for the request's whole life, as on Neuron.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable

from neuronmodel_runtime.engine.outputs import FINISH_ABORT
from neuronmodel_runtime.engine.request import Request, RequestStatus


@dataclass
class SchedulerOutput:
    """One engine step's plan, produced by `Scheduler.schedule()`."""

    prefills: list[Request] = field(default_factory=list)  # admitted this step, slots assigned, not yet prefilled
    decodes: list[Request] = field(default_factory=list)  # running requests that advance this step
    aborted: list[Request] = field(default_factory=list)  # finished by abort/timeout since the last step

    @property
    def empty(self) -> bool:
        return not (self.prefills or self.decodes or self.aborted)


class Scheduler:
    def __init__(self, num_slots: int, max_num_batched_tokens: int):
        self.num_slots = num_slots
        self.max_num_batched_tokens = max_num_batched_tokens  # prompt tokens prefilled per step at most
        self.waiting: deque[Request] = deque()  # FCFS
        self.running: dict[int, Request] = {}  # slot -> request
        self.free_slots: list[int] = list(range(num_slots - 1, -1, -1))  # pop() gives the lowest slot
        self._aborted: list[Request] = []  # finished by abort since the last schedule()

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def abort(self, request_ids: Iterable[str], reason: str = FINISH_ABORT) -> None:
        """Finish these requests wherever they are; their slots free at the next schedule()."""
        ids = set(request_ids)
        for req in [r for r in self.waiting if r.request_id in ids]:
            self.waiting.remove(req)
            self._finish_aborted(req, reason)
        for req in [r for r in self.running.values() if r.request_id in ids]:
            self._finish_aborted(req, reason)

    def abort_expired(self, now: float) -> None:
        expired = [r.request_id for r in (*self.waiting, *self.running.values()) if now > r.deadline]
        if expired:
            self.abort(expired)

    def schedule(self) -> SchedulerOutput:
        """Plan one step: decode all running, then admit waiting requests into free slots within the budget."""
        out = SchedulerOutput(aborted=self._aborted)
        self._aborted = []
        for req in out.aborted:
            self._release(req)
        out.decodes = list(self.running.values())
        budget = self.max_num_batched_tokens
        now = time.monotonic()
        while self.waiting and self.free_slots:
            req = self.waiting[0]
            # A prompt longer than the budget still runs alone, or it would wait forever.
            if len(req.prompt_ids) > budget and out.prefills:
                break
            self.waiting.popleft()
            budget -= len(req.prompt_ids)
            req.slot = self.free_slots.pop()
            req.status = RequestStatus.RUNNING
            req.metrics.scheduled = now
            self.running[req.slot] = req
            out.prefills.append(req)
        return out

    def finish(self, req: Request) -> None:
        """A request ended normally (stop or length) during the last step."""
        req.status = RequestStatus.FINISHED
        req.metrics.finished = time.monotonic()
        self._release(req)

    def _finish_aborted(self, req: Request, reason: str) -> None:
        if req.finished:
            return
        req.finish_reason = reason
        req.status = RequestStatus.FINISHED
        req.metrics.finished = time.monotonic()
        self._aborted.append(req)

    def _release(self, req: Request) -> None:
        if req.slot is not None and self.running.get(req.slot) is req:
            del self.running[req.slot]
            self.free_slots.append(req.slot)
            self.free_slots.sort(reverse=True)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self._aborted)
