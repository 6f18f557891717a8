"""POST /v1/chat/completions."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from neuronmodel_runtime.server.protocol import ChatCompletionRequest
from neuronmodel_runtime.server.serving import respond

router = APIRouter()


@router.post("/v1/chat/completions")
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    """Answer a conversation rendered with the model's chat template; `stream: true` answers with SSE chunks."""
    return respond(await request.app.state.chat.create(body, request))
