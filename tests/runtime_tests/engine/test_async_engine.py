"""The asyncio front: streams deliver in order, aborts free slots, the queue is bounded, shutdown ends streams."""

import asyncio
from dataclasses import replace

import pytest

from runtime_tests.helpers.fakes_runner import EOS, ByteTokenizer, ScriptedRunner, text_script
from neuronmodel_runtime.engine.async_engine import AsyncEngine, EngineNotRunning, QueueFullError
from neuronmodel_runtime.engine.engine import Engine
from neuronmodel_runtime.engine.outputs import FINISH_ABORT, FINISH_ERROR
from neuronmodel_runtime.runners.base import TokenLogprob
from neuronmodel_runtime.sampling.params import SamplingParams


def make(runner, max_queue=8):
    engine = Engine(runner, ByteTokenizer(), {EOS}, max_num_batched_tokens=100)
    front = AsyncEngine(engine, tokenizer=ByteTokenizer(), model_name="fake", max_queue=max_queue)
    front.start()
    return front


async def collect(stream):
    text, last = "", None
    async for out in stream:
        text += out.text
        last = out
    return text, last


async def test_concurrent_streams_complete_in_order():
    front = make(ScriptedRunner(text_script("hello world"), slots=2))
    streams = [front.add_request(str(i), [65 + i], SamplingParams()) for i in range(5)]
    results = await asyncio.gather(*(collect(s) for s in streams))
    assert [t for t, _ in results] == ["hello world"] * 5
    assert all(last.finished and last.metrics.ttft is not None for _, last in results)
    assert front.num_unfinished == 0 and await front.wait_idle(1.0)
    await front.shutdown()


class LogprobRunner(ScriptedRunner):
    """Each token's logprob names it, so the merged list can be checked against the token ids."""

    def prefill(self, batch):
        return self._with_logprobs(super().prefill(batch))

    def decode(self, batch):
        return self._with_logprobs(super().decode(batch))

    @staticmethod
    def _with_logprobs(out):
        return replace(out, logprobs=[[TokenLogprob(-1.0, {t: -1.0}) for t in row] for row in out.token_ids])


async def test_a_reader_behind_gets_what_is_queued_as_one_output():
    """A consumer slower than the steps reads every queued increment at once: text, token ids and logprobs joined in
    order, the last increment's counts and finish; nothing lost, and nothing merged past the final output."""
    front = make(LogprobRunner(text_script("hello world"), slots=1))
    stream = front.add_request("a", [65], SamplingParams(logprobs=0))
    assert await front.wait_idle(5.0)  # every step done before the first read
    outputs = [out async for out in stream]
    assert len(outputs) == 1
    (out,) = outputs
    assert out.text == "hello world" and out.finished and out.finish_reason == "stop"
    assert len(out.token_ids) == len(out.logprobs) == out.num_output_tokens == len("hello world") + 1  # + EOS
    assert [list(lp.top) for lp in out.logprobs] == [[t] for t in out.token_ids]
    await front.shutdown()


async def test_abort_mid_stream_frees_the_slot():
    runner = ScriptedRunner(text_script("x" * 10_000, then=120), slots=1, max_model_len=100_000)
    front = make(runner)
    stream = front.add_request("a", [1], SamplingParams())
    first = await stream.__anext__()
    assert first.token_ids
    stream.abort()
    _, last = await collect(stream)
    assert last.finish_reason == FINISH_ABORT
    text, _ = await collect(front.add_request("b", [1], SamplingParams(max_tokens=3)))
    assert text == "xxx" and runner.released[0] == 0
    await front.shutdown()


async def test_queue_limit_raises_queue_full_with_retry_after():
    front = make(ScriptedRunner(text_script("y" * 1000), slots=1, max_model_len=2000), max_queue=2)
    accepted = [front.add_request(str(i), [1], SamplingParams()) for i in range(3)]  # 1 slot + 2 waiting
    with pytest.raises(QueueFullError) as err:
        front.add_request("overflow", [1], SamplingParams())
    assert err.value.retry_after > 0
    for s in accepted:
        s.abort()
    await front.wait_idle(5.0)
    await front.shutdown()


async def test_not_accepting_after_stop_and_shutdown_fails_in_flight():
    front = make(ScriptedRunner(text_script("z" * 10_000), slots=1, max_model_len=100_000))
    stream = front.add_request("a", [1], SamplingParams())
    await stream.__anext__()
    front.stop_accepting()
    with pytest.raises(EngineNotRunning):
        front.add_request("b", [1], SamplingParams())
    await front.shutdown()
    _, last = await collect(stream)
    assert last.finish_reason == FINISH_ERROR and not front.alive
