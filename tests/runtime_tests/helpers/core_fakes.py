"""Builders of the engine core process (`EngineCoreClient(build=...)`) over the fakes, for process-mode tests: the
core imports them by name, so tests/ must be on its PYTHONPATH."""

from __future__ import annotations

from typing import Callable

from runtime_tests.helpers.fakes import ChatByteTokenizer, EchoRunner
from runtime_tests.helpers.fakes_runner import EOS
from neuronmodel_runtime.config import RuntimeConfig
from neuronmodel_runtime.engine.engine import Engine


def echo_engine(config: RuntimeConfig, on_lost: Callable[[str], None], delay: float = 0.0,
                fail: str = "") -> tuple[Engine, dict]:
    """The EchoRunner's engine (`delay` seconds per runner call); `fail`: loading raises this instead."""
    if fail:
        raise RuntimeError(fail)
    runner = EchoRunner(config.max_num_seqs, config.max_model_len, config.max_context_length, delay)
    engine = Engine(runner, ChatByteTokenizer(), {EOS}, config.max_num_batched_tokens,
                    config.server.request_timeout_s)
    return engine, {"fake": True}
