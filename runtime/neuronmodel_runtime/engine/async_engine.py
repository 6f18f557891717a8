"""The asyncio front of the engine: request streams over a step loop in this process or in a child.

`EngineFront` is what the server talks to: it accepts requests (or refuses them: not ready, queue full), hands
each its `RequestStream`, and delivers outputs into those streams on the event loop. Where the step loop runs is
the subclass's: `AsyncEngine` runs it on a thread of this process (step_loop.py); core_client.py's
`EngineCoreClient` runs it in a child process, off this process's GIL.

By default `AsyncEngine.start()` spawns the step thread. A process can instead give the step loop its main thread
(`own_thread=False`, then `run_step_loop()` there) and run the event loop elsewhere: measured with the reference
runner on 2 CPU cores, torch runs the same decode 13% slower from a spawned thread than from the main thread.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Optional

from neuronmodel_runtime.engine.engine import Engine
from neuronmodel_runtime.engine.outputs import EngineStats, RequestOutput
from neuronmodel_runtime.engine.step_loop import StepLoop
from neuronmodel_runtime.runners.base import RunnerCapabilities, RunnerCapacity
from neuronmodel_runtime.sampling.params import SamplingParams


class QueueFullError(RuntimeError):
    """Too many requests are waiting for a slot; the client should retry after `retry_after` seconds."""

    def __init__(self, max_queue: int, retry_after: float = 1.0):
        super().__init__(f"the server is at capacity ({max_queue} requests waiting); retry later")
        self.retry_after = retry_after


class EngineNotRunning(RuntimeError):
    """The engine is loading, draining for shutdown, or stopped."""


class RequestStream:
    """Async iterator over one request's outputs; the last one has `finished=True`."""

    def __init__(self, request_id: str, owner: "EngineFront"):
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


class EngineFront:
    """Streams, admission and delivery on the event loop; the step loop is the subclass's (`_submit`, `abort`)."""

    capacity: RunnerCapacity
    capabilities: RunnerCapabilities
    sampling_defaults: dict[str, float]
    eos_token_ids: frozenset[int]

    def __init__(self, *, tokenizer: Any, model_name: str, max_queue: int):
        self.tokenizer = tokenizer  # a transformers tokenizer (chat template, encode)
        self.model_name = model_name
        self.max_queue = max_queue
        self._streams: dict[str, RequestStream] = {}
        self._accepting = False
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    @property
    def alive(self) -> bool:
        raise NotImplementedError

    @property
    def ready(self) -> bool:
        return self.alive and self._accepting

    @property
    def num_unfinished(self) -> int:
        return len(self._streams)

    def start(self) -> None:
        """Start accepting; call from the event loop that will consume the streams."""
        self._loop = asyncio.get_running_loop()
        self._accepting = True

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

    def add_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> RequestStream:
        """Accept a request (from the event loop); raises QueueFullError or EngineNotRunning.

        The queue is full when the unfinished requests beyond the slots reach max_queue: the requests waiting for
        a slot, counted here without asking the step loop (a request finished there but not yet delivered still
        counts, for a step)."""
        if not self.ready:
            raise EngineNotRunning("the server is not accepting requests (loading or shutting down)")
        if request_id in self._streams:
            raise ValueError(f"duplicate request id {request_id!r}")
        if len(self._streams) - self.capacity.max_num_seqs >= self.max_queue:
            raise QueueFullError(self.max_queue)
        stream = RequestStream(request_id, self)
        self._submit(request_id, prompt_ids, params)  # its outputs reach _dispatch on this loop, after this returns
        self._streams[request_id] = stream
        return stream

    def _submit(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> None:
        raise NotImplementedError

    def abort(self, request_id: str) -> None:
        raise NotImplementedError

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        """Deliver outputs into their streams (on the event loop); a final output ends the stream's bookkeeping."""
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            if out.finished:
                del self._streams[out.request_id]
            stream._queue.put_nowait(out)

    def _post(self, outputs: list[RequestOutput]) -> None:
        """`_dispatch` from another thread (the step loop's, or the reader of the core's channel)."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._dispatch, outputs)


class AsyncEngine(EngineFront):
    """The step loop on a thread of this process."""

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
        super().__init__(tokenizer=tokenizer, model_name=model_name, max_queue=max_queue)
        self.engine = engine
        self.steps = StepLoop(engine, self._post)
        self._info = info or {}
        self._own_thread = own_thread  # False: the caller runs run_step_loop() on a thread of its choice
        self._thread: Optional[threading.Thread] = None

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
        return self.steps.running

    @property
    def own_thread(self) -> bool:
        """True: start() spawns the step thread; False: the caller runs run_step_loop()."""
        return self._own_thread

    def stalled_for(self, now: float) -> float:
        """Seconds the step loop has spent in its current iteration while requests wait on it; 0.0 when it is
        idle (no work is not a hang) or not running (`alive` reports that). A runner call that never returns, a
        known failure mode of Neuron runtimes, makes this grow without bound. `now` is a time.monotonic() value.
        """
        if self.steps.idle or not self.steps.running or not self._streams:
            return 0.0
        return max(0.0, now - self.steps.progress_at)

    def stats(self) -> EngineStats:
        stats = self.engine.stats
        stats.num_waiting = self.steps.num_waiting
        stats.num_running = self.engine.scheduler.num_running
        return stats

    def info(self) -> dict[str, Any]:
        return {**self._info, "runner": self.engine.runner.info()}

    # -- lifecycle --------------------------------------------------------------------------------------
    def start(self) -> None:
        super().start()
        if self._own_thread:
            self._thread = threading.Thread(target=self.run_step_loop, name="engine-step", daemon=True)
            self.steps.running = True
            self._thread.start()

    def run_step_loop(self) -> None:
        """The step loop; blocks until `shutdown()` or `stop_step_loop()`. Runs on the spawned thread by default."""
        self.steps.run()

    def stop_step_loop(self) -> None:
        """Make run_step_loop() return (in-flight requests fail); thread-safe."""
        self.steps.stop()

    async def shutdown(self) -> None:
        self._accepting = False
        self.steps.stop()
        if self.steps.running or self._thread is not None:
            await asyncio.to_thread(self.steps.stopped.wait)
        self.engine.runner.shutdown()

    # -- requests ---------------------------------------------------------------------------------------
    def _submit(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> None:
        self.steps.submit(self.engine.make_request(request_id, prompt_ids, params))

    def abort(self, request_id: str) -> None:
        self.steps.abort([request_id])
