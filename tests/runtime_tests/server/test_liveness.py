"""GET /health sees a hung step loop: 503 once a runner call has not returned for server.liveness_timeout_s while
requests wait on it; 200 while the loop is idle or progressing."""

import asyncio
import threading
from contextlib import asynccontextmanager
from typing import AsyncIterator

import httpx

from runtime_tests.helpers.fakes import ChatByteTokenizer, EchoRunner, make_config
from runtime_tests.helpers.fakes_runner import EOS
from neuronmodel_runtime.engine.async_engine import AsyncEngine
from neuronmodel_runtime.engine.engine import Engine
from neuronmodel_runtime.server.app import create_app

TIMEOUT_S = 0.5


class HangingRunner(EchoRunner):
    """Decode blocks until `unblock` is set: a Neuron runtime call that never returns."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.entered = threading.Event()
        self.unblock = threading.Event()

    def decode(self, batch):
        self.entered.set()
        self.unblock.wait()
        return super().decode(batch)


@asynccontextmanager
async def app_over(runner: EchoRunner) -> AsyncIterator[httpx.AsyncClient]:
    config = make_config(**{"server.liveness_timeout_s": TIMEOUT_S})
    tokenizer = ChatByteTokenizer()
    engine = Engine(runner, tokenizer, {EOS}, config.max_num_batched_tokens, config.server.request_timeout_s)
    front = AsyncEngine(engine, tokenizer=tokenizer, model_name="fake-model", max_queue=8)
    app = create_app(front, config)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test",
                                     timeout=30) as client:
            yield client


async def test_health_is_503_while_a_runner_call_hangs_with_requests_in_flight():
    runner = HangingRunner()
    async with app_over(runner) as client:
        try:
            await asyncio.sleep(TIMEOUT_S + 0.2)
            assert (await client.get("/health")).status_code == 200, "an idle engine is not hung"

            request = asyncio.ensure_future(
                client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 5, "temperature": 0}))
            assert await asyncio.to_thread(runner.entered.wait, 5.0)
            assert (await client.get("/health")).status_code == 200, "a step shorter than the timeout is fine"

            await asyncio.sleep(TIMEOUT_S + 0.2)
            r = await client.get("/health")
            assert r.status_code == 503
            error = r.json()["error"]
            assert error["code"] == "engine_stalled" and error["type"] == "service_unavailable"
            assert "no progress" in error["message"] and "liveness_timeout_s" in error["message"]
        finally:
            runner.unblock.set()
        assert (await request).json()["choices"][0]["text"] == "hello"
        assert (await client.get("/health")).status_code == 200


async def test_health_stays_200_while_steps_keep_completing():
    async with app_over(EchoRunner(delay=0.05)) as client:  # ~50 steps of 50 ms: longer than the timeout overall
        request = asyncio.ensure_future(
            client.post("/v1/completions", json={"prompt": "x" * 60, "max_tokens": 50, "temperature": 0}))
        statuses = []
        while not request.done():
            statuses.append((await client.get("/health")).status_code)
            await asyncio.sleep(0.1)
        assert (await request).json()["choices"][0]["text"] == "x" * 50
        assert len(statuses) > 10 and set(statuses) == {200}
