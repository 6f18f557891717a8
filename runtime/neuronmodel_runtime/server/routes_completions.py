"""POST /v1/completions."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from neuronmodel_runtime.server.errors import error_responses
from neuronmodel_runtime.server.protocol import CompletionRequest, CompletionResponse
from neuronmodel_runtime.server.serving import respond

router = APIRouter()


#: The 200 response beside the JSON object: with `stream: true`, server-sent events (OpenAI documents them so too).
_STREAM = {
    "description": "A completion object; with `stream: true`, server-sent events: each `data:` line is a completion "
                   "object holding the new text of one choice (and, with `stream_options.include_usage`, a last one "
                   "with `usage` and no choices), then `data: [DONE]`. A failure after the first event arrives as "
                   "a `data:` line with an error body.",
    "content": {"text/event-stream": {"schema": {"$ref": "#/components/schemas/CompletionResponse"}}},
}


@router.post(
    "/v1/completions",
    response_model=CompletionResponse,
    responses={200: _STREAM, **error_responses(400, 404, 413, 429, 500, 503)},
)
async def create_completion(body: CompletionRequest, request: Request) -> Response:
    """Complete a prompt (text, token ids, or a batch of either); `stream: true` answers with SSE chunks."""
    return respond(await request.app.state.completions.create(body, request))
