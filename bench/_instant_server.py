"""The runtime's server and engine around an instant runner: what the host costs per step at Neuron speed.

`InstantRunner` keeps the runner contract (fixed slots, one token per row per step, token ids out as on-device
sampling returns them) and computes nothing, so all the CPU a step costs here is the engine's and the server's:
scheduling, detokenizing, stop checks, streaming. Each step takes STEP_MS of wall time (sleeping, as a process
waiting on the device does): a Neuron step's pace, so that clients keep up as they would there. Run as a process by
bench/serving.py (`host_ms_per_step_b64`):

    python bench/_instant_server.py CONFIG.json [STEP_MS]   # a RuntimeConfig: model (its tokenizer), max_num_seqs,
                                                            # server.engine_process (the loop in a child process)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from neuronmodel_runtime.config import RuntimeConfig, load_config
from neuronmodel_runtime.engine.async_engine import AsyncEngine
from neuronmodel_runtime.engine.core_client import EngineCoreClient
from neuronmodel_runtime.engine.engine import Engine
from neuronmodel_runtime.server.tokenizer import eos_token_ids, load_tokenizer
from neuronmodel_runtime.runners.base import (
    DecodeBatch,
    ModelRunner,
    PrefillBatch,
    RunnerCapabilities,
    RunnerCapacity,
    StepOutput,
)
from neuronmodel_runtime.runners.device_sampling import sampling_capabilities
from neuronmodel_runtime.server.app import create_app
from neuronmodel_runtime.server.drain import serve


class InstantRunner(ModelRunner):
    """Every row's next token is the next one of a fixed English sentence (real words for the detokenizer), at
    once."""

    framework = "instant"

    def __init__(self, capacity: RunnerCapacity, text_ids: list[int], step_s: float = 0.0):
        self.cap = capacity
        self.text_ids = text_ids
        self.step_s = step_s
        self.position: dict[int, int] = {}

    def load(self) -> None:
        pass

    def capacity(self) -> RunnerCapacity:
        return self.cap

    def capabilities(self) -> RunnerCapabilities:
        return RunnerCapabilities(sampling_capabilities(self.framework, True, 256, top_p_rule="keep"))

    def prefill(self, batch: PrefillBatch) -> StepOutput:
        for slot in batch.slots:
            self.position[slot] = 0
        return StepOutput(token_ids=[[self._next(slot)] for slot in batch.slots])

    def decode(self, batch: DecodeBatch) -> StepOutput:
        time.sleep(self.step_s)
        return StepOutput(token_ids=[[self._next(slot)] for slot in batch.slots])

    def _next(self, slot: int) -> int:
        i = self.position[slot]
        self.position[slot] = i + 1
        return self.text_ids[i % len(self.text_ids)]

    def release(self, slot: int) -> None:
        self.position.pop(slot, None)

    def info(self) -> dict[str, Any]:
        return {"framework": self.framework}


def instant_engine(config: RuntimeConfig, on_lost: Any = None, step_ms: float = 0.0) -> tuple[Engine, dict]:
    """The engine around an InstantRunner taking `step_ms` per decode (the engine core process builds it by name)."""
    model = Path(str(config.model))
    tokenizer = load_tokenizer(model)
    text = tokenizer.encode(" The quick brown fox jumps over the lazy dog, and the story goes on like this.",
                            add_special_tokens=False)
    capacity = RunnerCapacity(config.max_num_seqs, config.max_context_length, config.max_model_len, 0,
                              len(tokenizer))
    engine = Engine(InstantRunner(capacity, text, step_ms / 1e3), tokenizer, eos_token_ids(model, tokenizer),
                    config.max_num_batched_tokens, config.server.request_timeout_s,
                    async_scheduling=config.server.async_scheduling)
    return engine, {}


def main(path: str, step_ms: float = 0.0) -> int:
    config = load_config(path)
    model = Path(str(config.model))
    if config.server.engine_process:  # the core loads this file for the builder
        serving = EngineCoreClient(config.model_dump_json(exclude_unset=True), tokenizer=load_tokenizer(model),
                                   model_name=model.name, max_queue=config.server.max_queue,
                                   build=f"{Path(__file__).resolve()}:instant_engine", build_args={"step_ms": step_ms})
    else:
        engine, _ = instant_engine(config, step_ms=step_ms)
        serving = AsyncEngine(engine, tokenizer=engine.tokenizer, model_name=model.name,
                              max_queue=config.server.max_queue, own_thread=False)
    return serve(create_app(serving, config), config)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], *map(float, sys.argv[2:3])))
