"""Streamed chunks rendered from templates (server/render.py) are, byte for byte, the chunks pydantic writes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from neuronmodel_runtime.engine.outputs import RequestOutput
from neuronmodel_runtime.server.protocol import (
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatDelta,
    CompletionChoice,
    CompletionResponse,
)
from neuronmodel_runtime.server.render import chat_chunks, completion_chunks

#: What JSON escapes, or might be thought to: quotes, backslashes, control characters, DEL, NEL, the line and
#: paragraph separators (raw in JSON, not in JavaScript), a BOM, emoji and other characters beyond the BMP.
SPECIAL = '"\\/\x00\x08\x0c\n\r\t\x1b\x1f\x7f\x85\u2028\u2029\ufeff\U0001f600\U0001d11e'
TEXTS = st.text(st.characters(codec="utf-8") | st.sampled_from(SPECIAL))  # utf-8: no lone surrogates
FINISHES = st.none() | st.sampled_from(["stop", "length", "abort", "error"])
STOP_REASONS = st.none() | TEXTS | st.integers(0, 2**31)
#: choice index, text, finish reason, stop reason
INCREMENTS = st.tuples(st.integers(0, 15), TEXTS, FINISHES, STOP_REASONS)


def completion_chunk(template: CompletionResponse, index: int, out: RequestOutput) -> str:
    choice = CompletionChoice(index=index, text=out.text, logprobs=None, finish_reason=out.finish_reason,
                              stop_reason=out.stop_reason)
    return template.model_copy(update={"choices": [choice]}).model_dump_json()


def chat_chunk(template: ChatCompletionChunk, index: int, out: RequestOutput) -> str:
    choice = ChatChunkChoice(index=index, delta=ChatDelta(content=out.text or None), logprobs=None,
                             finish_reason=out.finish_reason)
    return template.model_copy(update={"choices": [choice]}).model_dump_json()


@settings(max_examples=300, deadline=None)
@given(model=TEXTS, created=st.integers(0, 2**40), increments=st.lists(INCREMENTS, min_size=1, max_size=8))
def test_fast_chunks_equal_pydantic_bytes(model, created, increments):
    completion = CompletionResponse(id="cmpl-0f", created=created, model=model, choices=[])
    chat = ChatCompletionChunk(id="chatcmpl-0f", created=created, model=model, choices=[])
    fast_completion, fast_chat = completion_chunks(completion, 16), chat_chunks(chat, 16)
    for index, text, finish, stop in increments:
        out = RequestOutput("r", text, [1], 3, 1, finished=finish is not None, finish_reason=finish,
                            stop_reason=stop)
        assert fast_completion(index, out).encode() == completion_chunk(completion, index, out).encode()
        assert fast_chat(index, out).encode() == chat_chunk(chat, index, out).encode()
