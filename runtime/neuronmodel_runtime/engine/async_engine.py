"""The asyncio front of the engine.

The step loop runs on a thread of its own (a runner step is seconds of tensor work that must not block the event
loop); requests and aborts reach it through a locked inbox, and each request's outputs come back through
`loop.call_soon_threadsafe` into that request's `asyncio.Queue`.

By default `start()` spawns that thread. A process can instead give the step loop its main thread
(`own_thread=False`, then `run_step_loop()` there) and run the event loop elsewhere: measured with the reference
runner on 2 CPU cores, torch runs the same decode 13% slower from a spawned thread than from the main thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, Optional

from neuronmodel_runtime.engine.engine import Engine
from neuronmodel_runtime.engine.outputs import FINISH_ERROR, EngineStats, RequestOutput
from neuronmodel_runtime.engine.request import Request
from neuronmodel_runtime.runners.base import RunnerCapabilities, RunnerCapacity
from neuronmodel_runtime.sampling.params import SamplingParams

log = logging.getLogger(__name__)


class QueueFullError(RuntimeError):
    """Too many requests are waiting for a slot; the client should retry after `retry_after` seconds."""

    def __init__(self, max_queue: int, retry_after: float = 1.0):
        super().__init__(f"the server is at capacity ({max_queue} requests waiting); retry later")
        self.retry_after = retry_after


class EngineNotRunning(RuntimeError):
    """The engine is loading, draining for shutdown, or stopped."""


class RequestStream:
    """Async iterator over one request's outputs; the last one has `finished=True`."""

    def __init__(self, request_id: str, owner: "AsyncEngine"):
        self.request_id = request_id
        self._owner = owner
        self._queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self.finished = False

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        """The next output, merged with every later one already queued (`RequestOutput.then`)."""
        if self.finished:
            raise StopAsyncIteration
        out = await self._queue.get()
        while not out.finished and not self._queue.empty():
            out = out.then(self._queue.get_nowait())
        self.finished = out.finished
        return out

    def abort(self) -> None:
        """Stop generating and free the slot (client gone, timeout); a no-op once finished."""
        if not self.finished:
            self._owner.abort(self.request_id)


class AsyncEngine:
    def __init__(
        self,
        engine: Engine,
        *,
        tokenizer: Any,
        model_name: str,
        max_queue: int,
        info: Optional[dict[str, Any]] = None,
        own_thread: bool = True,
    ):
        self.engine = engine
        self.tokenizer = tokenizer  # a transformers tokenizer (chat template, encode)
        self.model_name = model_name
        self.max_queue = max_queue
        self._info = info or {}
        self._streams: dict[str, RequestStream] = {}
        self._inbox: list[Request] = []
        self._aborts: list[str] = []
        self._cv = threading.Condition()
        self._stopping = False
        self._accepting = False
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._own_thread = own_thread  # False: the caller runs run_step_loop() on a thread of its choice
        self._thread: Optional[threading.Thread] = None
        self._running = False  # the step loop is running
        self._stopped = threading.Event()  # the step loop has returned
        # Liveness, written by the step thread and read by /health (plain attribute writes, no lock):
        self._idle = True  # the step loop waits for work
        self._progress_at = time.monotonic()  # when the current step-loop iteration began
        self._admitted: dict[str, Request] = {}  # step thread only: given to the engine, no final output emitted yet

    # -- facts the server reads -------------------------------------------------------------------------
    @property
    def capacity(self) -> RunnerCapacity:
        return self.engine.capacity

    @property
    def capabilities(self) -> RunnerCapabilities:
        return self.engine.capabilities

    @property
    def sampling_defaults(self) -> dict[str, float]:
        return self.engine.sampling_defaults

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self.engine.eos_token_ids

    @property
    def alive(self) -> bool:
        return self._running

    @property
    def own_thread(self) -> bool:
        """True: start() spawns the step thread; False: the caller runs run_step_loop()."""
        return self._own_thread

    @property
    def ready(self) -> bool:
        return self.alive and self._accepting

    @property
    def num_unfinished(self) -> int:
        return len(self._streams)

    def stalled_for(self, now: float) -> float:
        """Seconds the step loop has spent in its current iteration while requests wait on it; 0.0 when it is
        idle (no work is not a hang) or not running (`alive` reports that). A runner call that never returns, a
        known failure mode of Neuron runtimes, makes this grow without bound. `now` is a time.monotonic() value.
        """
        if self._idle or not self._running or not self._streams:
            return 0.0
        return max(0.0, now - self._progress_at)

    def stats(self) -> EngineStats:
        stats = self.engine.stats
        stats.num_waiting = self.engine.scheduler.num_waiting + len(self._inbox)
        stats.num_running = self.engine.scheduler.num_running
        return stats

    def info(self) -> dict[str, Any]:
        return {**self._info, "runner": self.engine.runner.info()}

    # -- lifecycle --------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start accepting; call from the event loop that will consume the streams."""
        self._loop = asyncio.get_running_loop()
        if self._own_thread:
            self._thread = threading.Thread(target=self.run_step_loop, name="engine-step", daemon=True)
            self._running = True
            self._thread.start()
        self._accepting = True

    def run_step_loop(self) -> None:
        """The step loop; blocks until `shutdown()` or `stop_step_loop()`. Runs on the spawned thread by default."""
        self._running = True
        try:
            self._run()
        finally:
            self._running = False
            self._stopped.set()

    def stop_step_loop(self) -> None:
        """Make run_step_loop() return (in-flight requests fail); thread-safe."""
        with self._cv:
            self._stopping = True
            self._cv.notify()

    def stop_accepting(self) -> None:
        self._accepting = False

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until every accepted request finished; False if `timeout` passed first."""
        deadline = time.monotonic() + timeout
        while self._streams:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    async def shutdown(self) -> None:
        self._accepting = False
        self.stop_step_loop()
        if self._running or self._thread is not None:
            await asyncio.to_thread(self._stopped.wait)
        self.engine.runner.shutdown()

    # -- requests ---------------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> RequestStream:
        """Accept a request (from the event loop); raises QueueFullError or EngineNotRunning."""
        if not self.ready:
            raise EngineNotRunning("the server is not accepting requests (loading or shutting down)")
        if request_id in self._streams:
            raise ValueError(f"duplicate request id {request_id!r}")
        request = self.engine.make_request(request_id, prompt_ids, params)
        stream = RequestStream(request_id, self)
        with self._cv:
            waiting = self.engine.scheduler.num_waiting + len(self._inbox)
            free = self.capacity.max_num_seqs - self.engine.scheduler.num_running
            if waiting - free >= self.max_queue:
                raise QueueFullError(self.max_queue)
            self._streams[request_id] = stream
            self._inbox.append(request)
            self._cv.notify()
        return stream

    def abort(self, request_id: str) -> None:
        with self._cv:
            self._aborts.append(request_id)
            self._cv.notify()

    # -- the step thread --------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cv:
                while not (self._stopping or self._inbox or self._aborts or self.engine.has_work):
                    self._idle = True
                    self._cv.wait()
                self._progress_at = time.monotonic()  # before _idle turns False: a reader never sees a stale time
                self._idle = False
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
        """Post outputs to their streams (step thread). A final output ends the request's bookkeeping."""
        if outputs and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._dispatch, outputs)
        for out in outputs:
            if out.finished:
                self._admitted.pop(out.request_id, None)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            if out.finished:
                del self._streams[out.request_id]
            stream._queue.put_nowait(out)


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
