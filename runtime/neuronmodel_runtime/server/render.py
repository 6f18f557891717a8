"""Streamed token chunks rendered from per-response templates: the JSON pydantic writes, at a fraction of its cost.

Building a choice model, copying the response template and dumping it cost several µs of the event loop per
streamed token. Here a response renders its constant parts once, through pydantic (so its id and model name are
escaped as everywhere else), and each token splices in only what varies: the choice index, the text and the
finish. The text goes through json's C string encoder, which writes the same escapes as pydantic for any text
without lone surrogates (detokenized text has none). Chunks with logprobs stay with pydantic.
tests/runtime_tests/server/test_render.py holds these bytes equal to pydantic's.
"""

from __future__ import annotations

from json.encoder import encode_basestring
from typing import Callable, Optional, Union

from neuronmodel_runtime.engine.outputs import RequestOutput
from neuronmodel_runtime.server.protocol import ChatCompletionChunk, CompletionResponse

#: (choice index, output increment) -> one chunk's JSON.
Render = Callable[[int, RequestOutput], str]


def completion_chunks(template: CompletionResponse, choices: int) -> Render:
    """The chunks of a completion stream of `choices` choices (no logprobs)."""
    head, tail = _around_choices(template)
    starts = [f'{head}{{"index":{index},"text":' for index in range(choices)]
    unfinished = f',"logprobs":null,"finish_reason":null,"stop_reason":null}}{tail}'

    def render(index: int, out: RequestOutput) -> str:
        if out.finish_reason is None and out.stop_reason is None:
            end = unfinished
        else:
            end = (f',"logprobs":null,"finish_reason":{_json(out.finish_reason)},'
                   f'"stop_reason":{_json(out.stop_reason)}}}{tail}')
        return starts[index] + encode_basestring(out.text) + end

    return render


def chat_chunks(template: ChatCompletionChunk, choices: int) -> Render:
    """The token chunks of a chat completion stream of `choices` choices (no logprobs): a delta without a role,
    its content null when the increment has no text."""
    head, tail = _around_choices(template)
    starts = [f'{head}{{"index":{index},"delta":{{"role":null,"content":' for index in range(choices)]
    unfinished = f'}},"logprobs":null,"finish_reason":null}}{tail}'

    def render(index: int, out: RequestOutput) -> str:
        content = encode_basestring(out.text) if out.text else "null"
        end = unfinished if out.finish_reason is None else \
            f'}},"logprobs":null,"finish_reason":{_json(out.finish_reason)}}}{tail}'
        return starts[index] + content + end

    return render


def _around_choices(template: Union[CompletionResponse, ChatCompletionChunk]) -> tuple[str, str]:
    """The template's JSON up to its choice and from after it. The key's own quotes cannot occur inside a string
    value (JSON escapes them there), so the split point is unique."""
    head, key, tail = template.model_dump_json().partition('"choices":[]')
    if not key:
        raise ValueError("the template must have an empty choices list")
    return head + '"choices":[', "]" + tail


def _json(value: Optional[Union[str, int]]) -> str:
    """A finish or stop reason as JSON: null, a string (a stop string) or an integer (a stop token id)."""
    if value is None:
        return "null"
    return encode_basestring(value) if isinstance(value, str) else str(value)
