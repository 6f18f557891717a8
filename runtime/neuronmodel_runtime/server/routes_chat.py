"""POST /v1/chat/completions."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from neuronmodel_runtime.server.errors import error_responses
from neuronmodel_runtime.server.protocol import ChatCompletionRequest, ChatCompletionResponse
from neuronmodel_runtime.server.serving import respond

router = APIRouter()


#: The 200 response beside the JSON object: with `stream: true`, server-sent events (OpenAI documents them so too).
#: ChatCompletionChunk is named only here, so app.py adds it to the document's components.
_STREAM = {
    "description": "A chat completion object; with `stream: true`, server-sent events: each `data:` line is a chat "
                   "completion chunk (the first of each choice carries the role, the last its finish_reason; with "
                   "`stream_options.include_usage`, a last chunk has `usage` and no choices), then `data: [DONE]`. "
                   "A failure after the first event arrives as a `data:` line with an error body.",
    "content": {"text/event-stream": {"schema": {"$ref": "#/components/schemas/ChatCompletionChunk"}}},
}


@router.post(
    "/v1/chat/completions",
    response_model=ChatCompletionResponse,
    responses={200: _STREAM, **error_responses(400, 404, 413, 429, 500, 503)},
)
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    """Answer a conversation rendered with the model's chat template; `stream: true` answers with SSE chunks."""
    return respond(await request.app.state.chat.create(body, request))
