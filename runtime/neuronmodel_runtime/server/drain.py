"""`serve(app, config)`: run the app under uvicorn, with a graceful drain on SIGTERM (and Ctrl+C).

On the first signal /ready turns 503 and admission stops (new requests get 503); in-flight requests run to
completion, for at most `server.drain_timeout_s`, after which they are aborted. Only then is uvicorn told
to exit: it closes the connections and the lifespan shuts the engine down, and the process exits 0.
A second signal exits at once. An engine core process that dies (server.engine_process) stops the server at once,
and the process exits 1: there is nothing left to drain, and the kubelet restarts the container.

When the engine can run its step loop on the caller's thread, `serve` gives it the main thread and runs uvicorn
on a second one (see engine/async_engine.py for why); the signal handlers are then installed here, since only
the main thread receives signals.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
from types import FrameType
from typing import Optional

import uvicorn
from fastapi import FastAPI

from neuronmodel_runtime.config import RuntimeConfig
from neuronmodel_runtime.server.serving import Serving

log = logging.getLogger(__name__)

#: Seconds uvicorn waits for connections after the drain (they are done or aborted by then).
_CLOSE_TIMEOUT_S = 5


class DrainingServer(uvicorn.Server):
    """uvicorn's server whose exit signal starts a drain instead of closing connections at once."""

    def __init__(self, config: uvicorn.Config, serving: Serving, drain_timeout_s: float):
        super().__init__(config)
        self.serving = serving
        self.drain_timeout_s = drain_timeout_s
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._signalled = False
        self._drain_task: Optional[asyncio.Task] = None  # held so the task is not garbage-collected
        self.failed = False  # the engine is gone

    async def serve(self, sockets: Optional[list[socket.socket]] = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: Optional[FrameType]) -> None:
        """Signal handler (main thread; also safe from any thread). Does not re-raise the signal at exit,
        unlike uvicorn's, so a drained process exits 0."""
        if self._signalled or self._loop is None:
            self.should_exit = self.force_exit = True
            return
        self._signalled = True
        self._loop.call_soon_threadsafe(self._start_drain)

    def fail(self) -> None:
        """The engine is gone: stop serving now (its requests have ended with an error) and exit 1."""
        self.failed = self.should_exit = True

    def _start_drain(self) -> None:
        self._drain_task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        log.info("exit signal: draining (up to %.0f s)", self.drain_timeout_s)
        clean = await self.serving.drain(self.drain_timeout_s)
        log.info("drain %s; shutting down", "complete" if clean else "timed out")
        self.should_exit = True


def build_server(app: FastAPI, config: RuntimeConfig) -> DrainingServer:
    """The uvicorn server for `app` on config.server.host:port (logging is the caller's: the CLI sets it)."""
    uv_config = uvicorn.Config(
        app,
        host=config.server.host,
        port=config.server.port,
        log_config=None,
        access_log=False,  # serving logs one line per finished request instead
        timeout_graceful_shutdown=_CLOSE_TIMEOUT_S,
        lifespan="on",
    )
    return DrainingServer(uv_config, app.state.serving, config.server.drain_timeout_s)


def serve(app: FastAPI, config: RuntimeConfig) -> int:
    """Serve until a signal and a drain; returns the process exit code (0, or 1 if startup failed)."""
    server = build_server(app, config)
    engine = app.state.serving.engine
    if hasattr(engine, "on_failure"):  # an engine core process
        engine.on_failure = server.fail
    if getattr(engine, "own_thread", True) or threading.current_thread() is not threading.main_thread():
        server.run()
        return 0 if server.started and not server.failed else 1

    def run_uvicorn() -> None:
        try:
            server.run()  # off the main thread, uvicorn installs no signal handlers
        finally:
            engine.stop_step_loop()  # startup failed, or the lifespan has shut the engine down

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, server.handle_exit)
    http = threading.Thread(target=run_uvicorn, name="http")
    http.start()
    engine.run_step_loop()
    http.join()
    return 0 if server.started else 1
