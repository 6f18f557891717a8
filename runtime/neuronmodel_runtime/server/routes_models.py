"""GET /v1/models, /v1/models/{model} and /v1/info (framework detection, runner and config, secrets masked)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from neuronmodel_runtime.server.protocol import ModelCard, ModelList
from neuronmodel_runtime.server.serving import Serving

router = APIRouter()


def _card(serving: Serving) -> ModelCard:
    return ModelCard(
        id=serving.model_name, created=serving.created, max_model_len=serving.engine.capacity.max_model_len
    )


@router.get("/v1/models")
async def list_models(request: Request) -> dict:
    return ModelList(data=[_card(request.app.state.serving)]).model_dump()


@router.get("/v1/models/{model:path}")
async def retrieve_model(model: str, request: Request) -> dict:
    serving: Serving = request.app.state.serving
    serving.check_model(model)
    return _card(serving).model_dump()


@router.get("/v1/info")
async def info(request: Request) -> dict:
    serving: Serving = request.app.state.serving
    return {"model": serving.model_name, **serving.engine.info(), "config": serving.config.public_dict()}
