"""Every accepted request gets exactly one final output, promptly, whatever raises inside an engine step: the
requests the failed step had already finished get finish_reason "error", the running ones are failed as well,
and the engine keeps serving."""

import asyncio
from collections import Counter

import pytest

from runtime_tests.helpers.fakes_runner import EOS, ByteTokenizer, ScriptedRunner, text_script
from neuronmodel_runtime.engine.async_engine import AsyncEngine
from neuronmodel_runtime.engine.detokenizer import IncrementalDetokenizer
from neuronmodel_runtime.engine.engine import Engine
from neuronmodel_runtime.engine.outputs import FINISH_ERROR, FINISH_LENGTH
from neuronmodel_runtime.engine.request import Request
from neuronmodel_runtime.sampling.params import SamplingParams

INJECTED = "injected failure"


def _raise_once(monkeypatch, owner, name, when, after=False):
    """Make `owner.name` raise the first time `when(*args)` holds (after running the original when `after`)."""
    original, fired = getattr(owner, name), []

    def wrapper(*args, **kwargs):
        if after:
            result = original(*args, **kwargs)
        if not fired and when(*args, **({"result": result} if after else {})):
            fired.append(True)
            raise RuntimeError(f"{INJECTED} in {name}")
        return result if after else original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)


def _finished_by(result):
    return any(out.finished for out in result)


INJECTIONS = {
    # Engine._apply after the runner call succeeded: the requests its tokens finished are out of the scheduler.
    "update": lambda mp, front: _raise_once(mp, Engine, "_apply", lambda self, reqs, out, result: any(
        r.finish_reason for r in result), after=True),
    # Request.take_output of a finished request, inside Engine._text.
    "take_output": lambda mp, front: _raise_once(mp, Request, "take_output", lambda self: self.finish_reason),
    # The detokenizer's final flush (inside take_output).
    "detokenizer": lambda mp, front: _raise_once(mp, IncrementalDetokenizer, "flush", lambda self: True),
    # The emit callback, handed a final output.
    "emit": lambda mp, front: _raise_once(mp, front.steps, "_emit", _finished_by),
}


async def collect(stream):
    outputs = [out async for out in stream]
    return "".join(o.text for o in outputs), outputs[-1]


@pytest.mark.parametrize("where", INJECTIONS)
async def test_a_failure_late_in_a_step_still_ends_every_stream_exactly_once(monkeypatch, where):
    runner = ScriptedRunner(text_script("x" * 1000), slots=2, max_model_len=2000)
    front = AsyncEngine(Engine(runner, ByteTokenizer(), {EOS}, max_num_batched_tokens=100),
                        tokenizer=ByteTokenizer(), model_name="fake", max_queue=8)
    dispatched = []
    dispatch = front._dispatch
    monkeypatch.setattr(front, "_dispatch", lambda outs: (dispatched.extend(outs), dispatch(outs)))
    INJECTIONS[where](monkeypatch, front)
    front.start()
    with front.steps._cv:  # both requests reach the same step: one finishes in it, the other keeps running
        done_in_step = front.add_request("short", [1], SamplingParams(max_tokens=1))
        running = front.add_request("long", [1], SamplingParams())
    (_, short), (_, long) = await asyncio.wait_for(asyncio.gather(collect(done_in_step), collect(running)), 5)

    assert short.finished and short.finish_reason == FINISH_ERROR and INJECTED in short.error
    assert long.finished and long.finish_reason == FINISH_ERROR and INJECTED in long.error
    assert Counter(o.request_id for o in dispatched if o.finished) == {"short": 1, "long": 1}
    assert front.num_unfinished == 0 and front.alive

    text, last = await asyncio.wait_for(collect(front.add_request("after", [1], SamplingParams(max_tokens=3))), 5)
    assert (text, last.finish_reason) == ("xxx", FINISH_LENGTH)
    await front.shutdown()


async def test_a_failure_while_failing_the_running_requests_still_ends_them(monkeypatch):
    """take_output raises for every output of one request: its final output is made without it."""
    runner = ScriptedRunner(text_script("x" * 1000), slots=2, max_model_len=2000)
    front = AsyncEngine(Engine(runner, ByteTokenizer(), {EOS}, max_num_batched_tokens=100),
                        tokenizer=ByteTokenizer(), model_name="fake", max_queue=8)
    take_output = Request.take_output

    def broken(self):
        if self.request_id == "cursed":
            raise RuntimeError(f"{INJECTED} in take_output")
        return take_output(self)

    monkeypatch.setattr(Request, "take_output", broken)
    front.start()
    with front.steps._cv:
        cursed = front.add_request("cursed", [1], SamplingParams(max_tokens=5))
        fine = front.add_request("fine", [1], SamplingParams(max_tokens=5))
    (_, cursed_last), (fine_text, fine_last) = await asyncio.wait_for(
        asyncio.gather(collect(cursed), collect(fine)), 5)
    assert cursed_last.finish_reason == FINISH_ERROR and INJECTED in cursed_last.error
    assert fine_last.finished and front.num_unfinished == 0 and front.alive
    await front.shutdown()
