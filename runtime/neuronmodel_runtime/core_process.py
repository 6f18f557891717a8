"""The engine core process: `python -m neuronmodel_runtime.core_process FD`, started by engine/core_client.py.

It reads its start message from the socket FD (the RuntimeConfig, and the "module:function" that builds its
Engine), loads the runner, answers ready (or failed, with the one-line reason), and then runs the step loop on its
main thread while a reader thread feeds it the front's requests and aborts. Every step's outputs go back as one
message. It ends when the front says stop or is gone (the socket's end), or with the front itself (a kill -9 of
the front leaves no orphan holding the NeuronCores).
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import logging
import signal
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Callable

from neuronmodel_runtime.config import RuntimeConfig
from neuronmodel_runtime.engine.engine import Engine
from neuronmodel_runtime.engine.outputs import EngineStats, RequestOutput
from neuronmodel_runtime.engine.step_loop import StepLoop

log = logging.getLogger("neuronmodel_runtime.core_process")

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """SIGKILL when the front dies, even while a runner call never returns (Linux; elsewhere the socket's end
    stops the loop between steps)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


class Channel:
    """The socket to the front; sends from the step loop and from a runner's group watcher, one at a time."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self._lock = threading.Lock()

    def send(self, message: tuple) -> None:
        try:
            with self._lock:
                self.conn.send(message)
        except OSError:  # the front is gone: the reader stops the loop
            pass


def _builder(path: str) -> Callable[..., tuple[Engine, dict]]:
    """"package.module:function", or "/path/to/file.py:function" (a script beside no package: a bench's)."""
    module, _, function = path.rpartition(":")
    if not module.endswith(".py"):
        return getattr(importlib.import_module(module), function)
    spec = importlib.util.spec_from_file_location(Path(module).stem, module)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return getattr(loaded, function)


def _read_ops(conn: Connection, engine: Engine, steps: StepLoop) -> None:
    """The front's requests and aborts into the step loop, until it says stop or is gone."""
    try:
        while True:
            op = conn.recv()
            if op[0] == "add":
                steps.submit(engine.make_request(op[1], op[2], op[3]))
            elif op[0] == "abort":
                steps.abort(op[1])
            elif op[0] == "stop":
                break
    except (EOFError, OSError):
        log.error("the server process is gone: stopping")
    steps.stop()


def main(fd: int) -> int:
    for sig in (signal.SIGINT, signal.SIGTERM):  # the front drains on them, and needs this process meanwhile
        signal.signal(sig, signal.SIG_IGN)
    _die_with_parent()
    conn = Connection(fd)
    channel = Channel(conn)
    _, start = conn.recv()
    logging.basicConfig(level=start["log_level"], format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = RuntimeConfig.model_validate_json(start["config"])
        engine, info = _builder(start["build"])(config, on_lost=lambda why: channel.send(("lost", why)),
                                                **start["args"])
    except Exception as exc:  # the builder's errors are one line naming the fix (cli.core_engine)
        channel.send(("failed", " ".join(str(exc).split()) or type(exc).__name__))
        log.debug("loading failed", exc_info=True)
        return 2
    steps = StepLoop(engine, lambda outputs: _send_outputs(channel, outputs, steps),
                     on_idle=lambda: channel.send(("stats", _stats(steps))))
    channel.send(("ready", {"capacity": engine.capacity, "capabilities": engine.capabilities,
                            "sampling_defaults": engine.sampling_defaults, "eos_token_ids": engine.eos_token_ids,
                            "info": {**info, "runner": engine.runner.info()}}))
    threading.Thread(target=_read_ops, args=(conn, engine, steps), name="ops-reader", daemon=True).start()
    steps.run()
    engine.runner.shutdown()
    return 0


def _stats(steps: StepLoop) -> EngineStats:
    stats = steps.engine.stats
    stats.num_waiting, stats.num_running = steps.num_waiting, steps.engine.scheduler.num_running
    return stats


def _send_outputs(channel: Channel, outputs: list[RequestOutput], steps: StepLoop) -> None:
    channel.send(("outputs", [out.as_tuple() for out in outputs], _stats(steps)))


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
