"""POST /v1/completions."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from neuronmodel_runtime.server.protocol import CompletionRequest
from neuronmodel_runtime.server.serving import respond

router = APIRouter()


@router.post("/v1/completions")
async def create_completion(body: CompletionRequest, request: Request) -> Response:
    """Complete a prompt (text, token ids, or a batch of either); `stream: true` answers with SSE chunks."""
    return respond(await request.app.state.completions.create(body, request))
