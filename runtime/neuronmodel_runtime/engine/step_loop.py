"""The step loop: the engine's own thread of control, fed through a locked inbox.

Requests and aborts arrive from any thread (`submit`, `abort`); `run()` admits them between steps and hands every
step's outputs to `emit`: an event loop's queue in this process (async_engine.py), or the channel to the front-end
process (core_process.py). The loop survives a failing step: whatever was in flight then ends with an error.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Iterable, Optional

from neuronmodel_runtime.engine.engine import Engine
from neuronmodel_runtime.engine.outputs import FINISH_ERROR, RequestOutput
from neuronmodel_runtime.engine.request import Request

log = logging.getLogger(__name__)

Emit = Callable[[list[RequestOutput]], None]


class StepLoop:
    def __init__(self, engine: Engine, emit: Emit, on_idle: Optional[Callable[[], None]] = None):
        """on_idle: called after a step that leaves the engine without work (a step counts itself in the engine's
        stats after its outputs are out: the core process sends its final stats then)."""
        self.engine = engine
        self._emit_outputs = emit
        self._on_idle = on_idle
        self._inbox: list[Request] = []
        self._aborts: list[str] = []
        self._cv = threading.Condition()
        self._stopping = False
        self.running = False  # run() is running
        self.stopped = threading.Event()  # run() has returned
        # Liveness, written by the loop's thread and read by /health (plain attribute writes, no lock):
        self.idle = True  # the loop waits for work
        self.progress_at = time.monotonic()  # when the current iteration began
        self._admitted: dict[str, Request] = {}  # the loop's thread only: given to the engine, no final output yet

    @property
    def num_waiting(self) -> int:
        """Accepted requests without a slot (the scheduler's queue and the inbox)."""
        return self.engine.scheduler.num_waiting + len(self._inbox)

    def submit(self, request: Request) -> None:
        with self._cv:
            self._inbox.append(request)
            self._cv.notify()

    def abort(self, request_ids: Iterable[str]) -> None:
        with self._cv:
            self._aborts.extend(request_ids)
            self._cv.notify()

    def stop(self) -> None:
        """Make run() return (what is in flight fails); any thread."""
        with self._cv:
            self._stopping = True
            self._cv.notify()

    def run(self) -> None:
        """Step until stop(); blocks."""
        self.running = True
        try:
            self._run()
        finally:
            self.running = False
            self.stopped.set()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not (self._stopping or self._inbox or self._aborts or self.engine.has_work):
                    self.idle = True
                    self._cv.wait()
                self.progress_at = time.monotonic()  # before idle turns False: a reader never sees a stale time
                self.idle = False
                if self._stopping:
                    break
                inbox, self._inbox = self._inbox, []
                aborts, self._aborts = self._aborts, []
            try:
                for request in inbox:
                    self._admit(request)
                if aborts:
                    self.engine.abort(aborts)
                self.engine.step(self._emit)
            except Exception as exc:  # a bug, not bad input: fail what is in flight, keep the loop alive
                log.exception("engine step failed; failing its requests")
                self._fail_unfinished(f"engine step failed ({type(exc).__name__}: {exc}); retry the request")
            if self._on_idle is not None and not self.engine.has_work:
                self._on_idle()
        with self._cv:
            inbox, self._inbox = self._inbox, []
        for request in inbox:
            self._admit(request)
        self._fail_unfinished("the server shut down before this request finished")

    def _admit(self, request: Request) -> None:
        self._admitted[request.request_id] = request
        self.engine.add(request)

    def _fail_unfinished(self, why: str) -> None:
        """Give every admitted request that has no final output yet one with finish_reason "error".

        An exception late in a step (in the detokenizer, in `take_output`, in the engine's update, in `_emit`) can
        lose the final outputs of the requests that step had already finished: without this their clients, and
        the drain on SIGTERM, would wait for the request timeout. Never raises, so the step loop survives.
        """
        for stage in (self._fail_in_flight, self._fail_lost):
            try:
                stage(why)
            except Exception:
                log.exception("failing the unfinished requests: %s failed", stage.__name__)

    def _fail_in_flight(self, why: str) -> None:
        """Abort the waiting and running requests, free their slots, and emit their final outputs."""
        sched = self.engine.scheduler
        self.engine.discard_untexted()  # what _fail_lost does not end below ends now
        victims = [*sched.waiting, *sched.running.values()]
        for req in victims:
            req.error = req.error or why
        sched.abort([r.request_id for r in victims], reason=FINISH_ERROR)
        released = sched.schedule().aborted  # the victims, and any request aborted since the last step
        for req in released:
            if req.slot is not None:
                self.engine.runner.release(req.slot)
        self._emit([self._final_output(req, why) for req in released])

    def _fail_lost(self, why: str) -> None:
        """End the requests the scheduler no longer advances whose final output never reached `_emit`."""
        sched = self.engine.scheduler
        advancing = {r.request_id for r in (*sched.waiting, *sched.running.values()) if not r.finished}
        self._emit([_error_output(req, why) for rid, req in self._admitted.items() if rid not in advancing])

    def _final_output(self, req: Request, why: str) -> RequestOutput:
        """`req.take_output()`, or a bare error output when that fails too (a broken detokenizer)."""
        try:
            return req.take_output()
        except Exception:
            log.exception("request %s: its final output failed; ending it with an error", req.request_id)
            return _error_output(req, why)

    def _emit(self, outputs: list[RequestOutput]) -> None:
        """Hand outputs on; a final output ends the request's bookkeeping."""
        if outputs:
            self._emit_outputs(outputs)
        for out in outputs:
            if out.finished:
                self._admitted.pop(out.request_id, None)


def _error_output(req: Request, why: str) -> RequestOutput:
    """A final output with finish_reason "error" and no new text, for a request whose own final output was lost."""
    req.metrics.finished = req.metrics.finished or time.monotonic()
    return RequestOutput(
        request_id=req.request_id,
        text="",
        token_ids=[],
        num_prompt_tokens=len(req.prompt_ids),
        num_output_tokens=len(req.output_ids),
        finished=True,
        finish_reason=FINISH_ERROR,
        error=why,
        metrics=req.metrics,
    )
