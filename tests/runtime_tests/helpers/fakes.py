"""Test doubles for the server tests: a byte tokenizer with a chat template, and a runner that echoes or samples.

The server tests run the real AsyncEngine and Engine over `EchoRunner`, so the HTTP layer meets the engine's
real streams, waiting queue, aborts and timeouts, in milliseconds and without torch.
"""

from __future__ import annotations

import random
import socket
import threading
import time
from contextlib import asynccontextmanager, contextmanager
from typing import Any, AsyncIterator, Iterator, Optional

import httpx

from runtime_tests.helpers.fakes_runner import EOS, ByteTokenizer
from neuronmodel_runtime.config import RuntimeConfig, load_config
from neuronmodel_runtime.engine.async_engine import AsyncEngine
from neuronmodel_runtime.engine.engine import Engine
from neuronmodel_runtime.runners.base import (
    DecodeBatch,
    ModelRunner,
    PrefillBatch,
    RunnerCapabilities,
    RunnerCapacity,
    StepOutput,
    TokenLogprob,
)
from neuronmodel_runtime.sampling.params import RowSampling, SamplingCapabilities

MODEL = "fake-model"
SAMPLED_ALPHABET = b"abcdefghij "
FAIL = b"FAIL"  # a prompt starting with it makes the runner's prefill raise


class ChatByteTokenizer(ByteTokenizer):
    """ByteTokenizer plus the transformers calls the server makes (encode's flag, a chat template)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def apply_chat_template(self, conversation: list[dict], tokenize: bool = False,
                            add_generation_prompt: bool = False) -> str:
        assert not tokenize
        if conversation[0]["role"] == "assistant":
            raise ValueError("Conversation must start with a user or system message")  # like real templates do
        text = "".join(f"<{m['role']}>{m['content']}\n" for m in conversation)
        return text + ("<assistant>" if add_generation_prompt else "")


class EchoRunner(ModelRunner):
    """Greedy rows echo their prompt then emit EOS (a "." while EOS is masked); sampled rows draw letters from a per-slot seeded RNG
    (never EOS). `delay` seconds per call make generation slow enough to disconnect or drain mid-way;
    a prompt starting with FAIL makes prefill raise."""

    framework = "fake"

    def __init__(self, slots: int = 4, max_model_len: int = 256, max_context_length: int = 128, delay: float = 0.0,
                 logprobs: bool = False):
        self.cap = RunnerCapacity(slots, max_context_length, max_model_len, 0, 257)
        self.caps = RunnerCapabilities(SamplingCapabilities(
            "fake", max_top_k=256, top_p_rule="keep", logprobs=logprobs, stop_token_masking=True,
            fixes={"logprobs": "start it with sampling.on_device=false to get logprobs"},
        ))
        self.delay = delay
        self.seqs: dict[int, tuple[list[int], int, random.Random]] = {}  # slot -> (prompt, produced, rng)

    def load(self) -> None:
        pass

    def capacity(self) -> RunnerCapacity:
        return self.cap

    def capabilities(self) -> RunnerCapabilities:
        return self.caps

    def _next(self, slot: int, row: RowSampling) -> int:
        prompt, produced, rng = self.seqs[slot]
        self.seqs[slot] = (prompt, produced + 1, rng)
        if row.top_k == 1:
            token = prompt[produced] if produced < len(prompt) else EOS
            return ord(".") if token in row.masked_token_ids else token  # min_tokens: EOS is masked
        return rng.choice(SAMPLED_ALPHABET)

    def _step(self, slots: list[int], sampling: list[RowSampling], num_logprobs: list[Optional[int]]) -> StepOutput:
        time.sleep(self.delay)
        tokens = [[self._next(slot, row)] for slot, row in zip(slots, sampling)]
        if all(n is None for n in num_logprobs):
            return StepOutput(tokens)
        return StepOutput(tokens, [None if n is None else [_logprob(t[0], n)] for t, n in zip(tokens, num_logprobs)])

    def prefill(self, batch: PrefillBatch) -> StepOutput:
        if any(bytes(p[: len(FAIL)]) == FAIL for p in batch.prompt_ids):
            raise RuntimeError("injected runner failure")
        for slot, prompt, row in zip(batch.slots, batch.prompt_ids, batch.sampling):
            self.seqs[slot] = (list(prompt), 0, random.Random(row.seed))
        return self._step(batch.slots, batch.sampling, batch.num_logprobs or [None] * len(batch.slots))

    def decode(self, batch: DecodeBatch) -> StepOutput:
        return self._step(batch.slots, batch.sampling, batch.num_logprobs or [None] * len(batch.slots))

    def release(self, slot: int) -> None:
        self.seqs.pop(slot, None)


def _logprob(token: int, n: int) -> TokenLogprob:
    """The chosen token at -0.25, then '?' and '@' as alternatives; `n` of them in `top`."""
    top = {token: -0.25, ord("?"): -1.5, ord("@"): -2.5}
    return TokenLogprob(-0.25, dict(list(top.items())[:n]))


def make_config(**dotted: Any) -> RuntimeConfig:
    """A RuntimeConfig from dotted overrides, e.g. make_config(**{"server.api_key": "k"})."""
    base = {"max_model_len": 256, "max_context_length": 128, "max_num_seqs": 4}
    return load_config(None, {**base, **dotted}, env={})


def make_engine(config: RuntimeConfig, delay: float = 0.0) -> AsyncEngine:
    """The real AsyncEngine over EchoRunner, sized by `config` (not started: the app's lifespan starts it)."""
    tokenizer = ChatByteTokenizer()
    runner = EchoRunner(config.max_num_seqs, config.max_model_len, config.max_context_length, delay,
                        logprobs=not config.sampling.on_device)
    engine = Engine(runner, tokenizer, {EOS}, config.max_num_batched_tokens, config.server.request_timeout_s)
    info = {"framework": {"selected": {"framework": "fake", "version": "0.0"}}}
    return AsyncEngine(engine, tokenizer=tokenizer, model_name=MODEL, max_queue=config.server.max_queue, info=info)


@asynccontextmanager
async def asgi_client(config: Optional[RuntimeConfig] = None, delay: float = 0.0
                      ) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    """(client, app) talking to create_app in-process through httpx.ASGITransport, lifespan included."""
    from neuronmodel_runtime.server.app import create_app

    config = config or make_config()
    app = create_app(make_engine(config, delay), config)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=30) as client:
            yield client, app


@contextmanager
def live_server(config: Optional[RuntimeConfig] = None, delay: float = 0.0,
                engine: Optional[AsyncEngine] = None) -> Iterator[tuple[str, Any, Any]]:
    """(base URL, app, DrainingServer): a real uvicorn server on a free port, run on a background thread, around
    `engine` (default: the EchoRunner's, `make_engine(config, delay)`)."""
    from neuronmodel_runtime.server.app import create_app
    from neuronmodel_runtime.server.drain import build_server

    config = config or make_config()
    app = create_app(engine or make_engine(config, delay), config)
    server = build_server(app, config)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        for _ in range(500):
            if server.started or not thread.is_alive():
                break
            time.sleep(0.01)
        assert server.started, "uvicorn did not start"
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", app, server
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()
