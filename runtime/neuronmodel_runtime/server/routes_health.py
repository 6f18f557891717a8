"""Probes and scraping, never behind the API key: GET /health (liveness), /ready (readiness), /metrics."""

from __future__ import annotations

import time

from typing import Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel
from starlette.responses import PlainTextResponse, Response

from neuronmodel_runtime.server.errors import APIError, error_response
from neuronmodel_runtime.server.serving import Serving

router = APIRouter()


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Readiness(BaseModel):
    status: Literal["ready"] = "ready"


_DEAD = error_response("The engine's step loop is not running (`code`: engine_dead), or requests have waited on it "
                       "for longer than server.liveness_timeout_s (`code`: engine_stalled): restart the process.")
_NOT_READY = error_response("Loading, draining for shutdown, or the engine stopped (`code`: not_ready).")


@router.get("/health", responses={503: _DEAD})
async def health(request: Request) -> Health:
    """200 while the engine's step loop runs and makes progress; 503 (restart me) when it is not running, or
    when requests have waited on one step-loop iteration for longer than server.liveness_timeout_s."""
    serving: Serving = request.app.state.serving
    if not serving.engine.alive:
        raise APIError(503, "the engine step thread is not running", code="engine_dead")
    stalled, limit = serving.engine.stalled_for(time.monotonic()), serving.config.server.liveness_timeout_s
    if stalled > limit:
        raise APIError(
            503,
            f"the engine step loop has made no progress for {stalled:.1f} s with requests in flight "
            f"(server.liveness_timeout_s is {limit:g} s): the model runner is probably hung; restart the process",
            code="engine_stalled",
        )
    return Health()


@router.get("/ready", responses={503: _NOT_READY})
async def ready(request: Request) -> Readiness:
    """200 when the model is loaded and requests are accepted; 503 while loading or draining."""
    serving: Serving = request.app.state.serving
    if not serving.ready:
        state = "draining for shutdown" if serving.draining else "the model is loading or the engine stopped"
        raise APIError(503, f"not ready: {state}", code="not_ready")
    return Readiness()


@router.get("/metrics", response_class=PlainTextResponse)  # the class only documents text/plain
async def metrics(request: Request) -> Response:
    """Prometheus exposition, vLLM's metric names."""
    m = request.app.state.metrics
    return Response(m.render(), media_type=m.content_type)
