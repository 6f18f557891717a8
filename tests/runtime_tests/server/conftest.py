"""A real server around the real reference runner: the torch runner and the committed tiny model, shared by the
fuzzing and the request-limit tests (loaded once per session)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from runtime_tests.helpers.fakes import live_server

TINY = Path(__file__).resolve().parents[2] / "assets" / "tiny" / "target"
#: Short sequences keep every generated request cheap: nothing a client sends makes a request run longer than
#: max_model_len tokens, and the fuzzer sends thousands.
TINY_SERVER = {"model": str(TINY), "framework": "torch", "max_num_seqs": 4, "max_model_len": 64,
               "max_context_length": 48, "server": {"max_queue": 32, "max_request_bytes": 64 * 1024}}


@pytest.fixture(scope="session")
def tiny_server() -> Iterator[tuple[str, Any]]:
    """(base URL, RuntimeConfig) of a uvicorn server on a thread around the torch runner and the tiny model."""
    if not (TINY / "config.json").is_file():
        pytest.skip("no tiny test model (make tiny-models)")
    from neuronmodel_runtime.cli import build_engine
    from neuronmodel_runtime.config import RuntimeConfig

    config = RuntimeConfig.model_validate(TINY_SERVER)
    with live_server(config, engine=build_engine(config)) as (url, _, _):
        yield url, config
