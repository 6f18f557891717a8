"""A streamed response whose reader fell behind the engine: what was merged into one output still reaches the client,
also when that output is the runner's error."""

import json

from neuronmodel_runtime.engine.async_engine import RequestStream
from neuronmodel_runtime.engine.outputs import FINISH_ERROR, RequestOutput
from neuronmodel_runtime.server.serving import Generation


class _Owner:
    def abort(self, request_id: str) -> None:
        pass


class _Metrics:
    def observe_finished(self, out: RequestOutput) -> None:
        pass


async def test_text_merged_into_an_error_output_is_sent_before_the_error_event():
    stream = RequestStream("r", _Owner())
    for out in (RequestOutput("r", "ab", [1, 2], 3, 2), RequestOutput("r", "cd", [3, 4], 3, 4),
                RequestOutput("r", "", [], 3, 4, finished=True, finish_reason=FINISH_ERROR, error="runner broke")):
        stream._queue.put_nowait(out)  # all queued before the first read: the stream merges them into one output
    generation = Generation("r", [stream], [3], _Metrics(), on_close=lambda g: None)

    def render(index: int, out: RequestOutput) -> str:
        return json.dumps({"text": out.text, "finish_reason": out.finish_reason})

    events = [event async for event in generation.events(render, None, include_usage=False)]
    assert json.loads(events[0]) == {"text": "abcd", "finish_reason": None}
    assert "runner broke" in json.loads(events[1])["error"]["message"] and events[2:] == ["[DONE]"]
