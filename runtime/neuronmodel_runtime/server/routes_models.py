"""GET /v1/models, /v1/models/{model} and /v1/info (framework detection, runner and config, secrets masked)."""

from __future__ import annotations

from typing import Any, Optional

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import JSONResponse, Response

from neuronmodel_runtime.server.errors import error_responses
from neuronmodel_runtime.server.protocol import ModelCard, ModelList
from neuronmodel_runtime.server.serving import Serving

router = APIRouter()


class ServerInfo(BaseModel):
    """What serves the model, and how."""

    # Documents the route's body; the route answers the engine's dict as it is, without validating it.
    model_config = ConfigDict(extra="allow")

    model: str = Field(description="The served model name.")
    framework: Optional[dict[str, Any]] = Field(
        None, description="Framework detection: requested, detected (installed packages, Neuron devices), selected "
                          "(framework, version, reason).")
    speculation: Optional[dict[str, Any]] = Field(None, description="The speculation config in effect.")
    runner: dict[str, Any] = Field(description="The loaded runner: framework, versions, device, dtype, capabilities.")
    config: dict[str, Any] = Field(description="The effective RuntimeConfig, secrets masked.")


def _card(serving: Serving) -> ModelCard:
    return ModelCard(
        id=serving.model_name, created=serving.created, max_model_len=serving.engine.capacity.max_model_len
    )


@router.get("/v1/models")
async def list_models(request: Request) -> ModelList:
    """The one model this server serves."""
    return ModelList(data=[_card(request.app.state.serving)])


@router.get("/v1/models/{model:path}", responses=error_responses(404))
async def retrieve_model(model: str, request: Request) -> ModelCard:
    serving: Serving = request.app.state.serving
    serving.check_model(model)
    return _card(serving)


@router.get("/v1/info", response_model=ServerInfo)
async def info(request: Request) -> Response:
    """Which framework serves the model and why, the runner, and the effective config (secrets masked)."""
    serving: Serving = request.app.state.serving
    return JSONResponse({"model": serving.model_name, **serving.engine.info(), "config": serving.config.public_dict()})
