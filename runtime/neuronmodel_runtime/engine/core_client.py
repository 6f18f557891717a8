"""The front of an engine core in a child process (`server.engine_process`).

The child (`python -m neuronmodel_runtime.core_process`) loads the runner and runs the step loop on its main
thread; this process keeps HTTP, tokenizing and rendering. So the step loop never waits for the event loop's GIL,
nor the event loop for the step loop's. They talk over a socketpair, one pickled message at a time
(multiprocessing's Connection frames them):

- to the core: `("add", request_id, prompt_ids, SamplingParams)`, `("abort", [request_id, ...])`, `("stop",)`;
- from the core: `("ready", facts)` or `("failed", message)` once, then `("outputs", [RequestOutput.as_tuple(),
  ...], EngineStats)` per step that has any, `("stats", EngineStats)` when the loop goes idle, and `("lost", why)`
  when a multi-node group is gone.

The core ignores SIGINT and SIGTERM (a drain needs it) and dies with this process. If the core dies, every
unfinished stream ends with finish_reason "error", /health and /ready answer 503, and `on_failure` runs (the server
exits non-zero, so the kubelet restarts the container).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any, Callable, Optional

from neuronmodel_runtime.engine.async_engine import EngineFront
from neuronmodel_runtime.engine.outputs import FINISH_ERROR, EngineStats, RequestOutput
from neuronmodel_runtime.runners.base import RunnerError
from neuronmodel_runtime.sampling.params import SamplingParams

log = logging.getLogger(__name__)

#: How long a core that was told to stop may take (its runner's shutdown) before it is killed.
STOP_TIMEOUT_S = 30.0


class EngineCoreFailed(RunnerError):
    """The engine core process could not start; the message is its own one-line reason."""


def exit_reason(code: int) -> str:
    if code < 0:
        return f"signal {signal.Signals(-code).name}" if -code in signal.valid_signals() else f"signal {-code}"
    return f"exit code {code}"


class EngineCoreClient(EngineFront):
    def __init__(self, config_json: str, *, tokenizer: Any, model_name: str, max_queue: int, build: str,
                 build_args: Optional[dict] = None, log_level: str = "INFO"):
        """Start the core and wait until it has loaded its runner (raises EngineCoreFailed with its reason).

        build: "module:function" (or "/path/file.py:function") that the core calls as function(config,
        on_lost=..., **build_args) for its (Engine, info): cli.core_engine in production, a fake's in tests.
        """
        super().__init__(tokenizer=tokenizer, model_name=model_name, max_queue=max_queue)
        ours, theirs = socket.socketpair()
        with theirs:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "neuronmodel_runtime.core_process", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),))
        self._conn = Connection(ours.detach())
        self._send_lock = threading.Lock()
        self._closing = False
        self._reader: Optional[threading.Thread] = None
        self.failure: Optional[str] = None  # why the core is gone, when it died
        self.on_failure: Callable[[], None] = lambda: None  # run on the event loop when the core dies
        self._stats = EngineStats(num_running=0, num_waiting=0, num_slots=0)
        self._heard_at = self._busy_since = time.monotonic()
        self._send(("start", {"config": config_json, "build": build, "args": build_args or {},
                              "log_level": log_level}))
        facts = self._startup()
        self.capacity, self.capabilities = facts["capacity"], facts["capabilities"]
        self.sampling_defaults, self.eos_token_ids = facts["sampling_defaults"], facts["eos_token_ids"]
        self._info = facts["info"]
        self._stats.num_slots = self.capacity.max_num_seqs

    def _startup(self) -> dict:
        try:
            kind, payload = self._conn.recv()
        except (EOFError, OSError):
            code = self._process.wait()
            raise EngineCoreFailed(f"the engine process exited with {exit_reason(code)} while loading the model "
                                   "(its log above says why)") from None
        if kind == "failed":
            self._process.wait()
            raise EngineCoreFailed(payload)
        return payload

    # -- facts the server reads -------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self.failure is None and self._process.poll() is None

    def stalled_for(self, now: float) -> float:
        """Seconds without a step's outputs while requests wait on the core (see AsyncEngine.stalled_for): every
        step with work sends outputs, so the silence since the last, or since the first request of a busy spell,
        is the current iteration's length."""
        if not self._streams or not self.alive:
            return 0.0
        return max(0.0, now - max(self._heard_at, self._busy_since))

    def stats(self) -> EngineStats:
        return self._stats

    def info(self) -> dict[str, Any]:
        return self._info

    # -- lifecycle --------------------------------------------------------------------------------------
    def start(self) -> None:
        super().start()
        self._reader = threading.Thread(target=self._read, name="engine-core-reader", daemon=True)
        self._reader.start()

    async def shutdown(self) -> None:
        """The core fails what is left ("the server shut down"), shuts its runner down and exits."""
        self._accepting = False
        self._closing = True
        self._send(("stop",))
        try:
            await asyncio.to_thread(self._process.wait, STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.error("the engine process did not stop within %.0f s; killing it", STOP_TIMEOUT_S)
            self._process.kill()
            await asyncio.to_thread(self._process.wait)
        if self._reader is not None:
            await asyncio.to_thread(self._reader.join)
        self._conn.close()

    # -- requests ---------------------------------------------------------------------------------------
    def _submit(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> None:
        if not self._streams:
            self._busy_since = time.monotonic()
        self._send(("add", request_id, prompt_ids, params))

    def abort(self, request_id: str) -> None:
        self._send(("abort", [request_id]))

    def _send(self, message: tuple) -> None:
        """To the core; a core that is gone is the reader's to report."""
        try:
            with self._send_lock:
                self._conn.send(message)
        except OSError:
            pass

    # -- the reader thread ------------------------------------------------------------------------------
    def _read(self) -> None:
        try:
            while True:
                message = self._conn.recv()
                if message[0] == "outputs":
                    self._heard_at, self._stats = time.monotonic(), message[2]
                    self._post([RequestOutput(*fields) for fields in message[1]])
                elif message[0] == "stats":  # the loop went idle: its last step counted
                    self._stats = message[1]
                elif message[0] == "lost":
                    log.error("the engine's group is lost (%s): not accepting requests", message[1])
                    self.stop_accepting()
        except (EOFError, OSError):
            pass
        if not self._closing:
            self._died(exit_reason(self._process.wait()))

    def _died(self, reason: str) -> None:
        self.failure = f"the engine process exited unexpectedly ({reason})"
        log.error("%s: failing %d request(s) in flight and stopping the server", self.failure, len(self._streams))
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._fail_streams)

    def _fail_streams(self) -> None:
        self._accepting = False
        self._dispatch([RequestOutput(request_id=rid, text="", token_ids=[], num_prompt_tokens=0,
                                      num_output_tokens=0, finished=True, finish_reason=FINISH_ERROR,
                                      error=f"{self.failure}; retry the request")
                        for rid in list(self._streams)])
        self.on_failure()
