"""`create_app(engine, config)`: the FastAPI application around one AsyncEngine.

The lifespan starts the engine's step loop on the server's event loop and shuts it down after uvicorn has
drained the connections. Routers stay thin: they fetch the serving objects from `app.state`.

The app publishes its OpenAPI document at /openapi.json and Swagger UI at /docs, outside /v1/ and so never behind
the API key. FastAPI's Swagger UI page loads its JavaScript and CSS from cdn.jsdelivr.net: the reader's browser
fetches them, not the pod, so /docs works through `kubectl port-forward` from a machine with internet access and is
blank in an air-gapped browser, where /openapi.json still serves (vLLM serves the same page).
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from neuronmodel_runtime import __version__
from neuronmodel_runtime.config import RuntimeConfig
from neuronmodel_runtime.server import routes_chat, routes_completions, routes_health, routes_models
from neuronmodel_runtime.server.auth import PROTECTED_PREFIX, APIKeyMiddleware
from neuronmodel_runtime.server.errors import error_responses, install_error_handlers
from neuronmodel_runtime.server.limits import BodySizeLimitMiddleware
from neuronmodel_runtime.server.metrics import Metrics
from neuronmodel_runtime.server.protocol import ChatCompletionChunk
from neuronmodel_runtime.server.serving import Serving
from neuronmodel_runtime.server.serving_chat import ChatServing
from neuronmodel_runtime.server.serving_completions import CompletionServing

_REF = "#/components/schemas/{model}"
#: Models the routes name only in their text/event-stream content, which FastAPI does not collect.
_STREAM_MODELS: tuple[type[BaseModel], ...] = (ChatCompletionChunk,)
_DESCRIPTION = "OpenAI-compatible completions and chat completions (with vLLM's extensions), served on AWS Neuron."


def create_app(engine: Any, config: RuntimeConfig) -> FastAPI:
    """Build the app. `engine` is an `AsyncEngine` (loaded, not started: the lifespan starts it).

    Args:
        engine: the AsyncEngine (or a double with the same interface).
        config: the process's RuntimeConfig; `server.*` and `sampling.*` apply here.
    """

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            await engine.shutdown()

    app = FastAPI(title="neuronmodel", version=__version__, description=_DESCRIPTION, lifespan=lifespan,
                  redoc_url=None)
    serving = Serving(engine, config, Metrics(engine, engine.model_name))
    app.state.serving = serving
    app.state.metrics = serving.metrics
    app.state.completions = CompletionServing(serving)
    app.state.chat = ChatServing(serving)
    install_error_handlers(app)
    protected = config.server.api_key is not None
    if protected:
        app.add_middleware(APIKeyMiddleware, api_key=config.server.api_key.get_secret_value())
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=config.server.max_request_bytes)  # added last: outermost
    for module in (routes_completions, routes_chat, routes_models):  # all under /v1/
        app.include_router(module.router, responses=error_responses(401) if protected else None)
    app.include_router(routes_health.router)
    app.openapi = lambda: _openapi(app, protected)  # FastAPI's documented way to extend its document
    return app


def _openapi(app: FastAPI, protected: bool) -> dict[str, Any]:
    """FastAPI's document (built once), corrected where this server differs from FastAPI's defaults."""
    if app.openapi_schema is None:
        doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        _drop_validation_errors(doc)
        _add_models(doc, _STREAM_MODELS)
        if protected:
            _require_bearer(doc)
        app.openapi_schema = doc
    return app.openapi_schema


def _drop_validation_errors(doc: dict[str, Any]) -> None:
    """FastAPI documents a 422 for every route with parameters; this server answers those errors as 400
    with OpenAI's error body (errors.py), which the routes document."""
    for item in doc["paths"].values():
        for operation in item.values():
            operation["responses"].pop("422", None)
    for name in ("HTTPValidationError", "ValidationError"):
        doc["components"]["schemas"].pop(name, None)


def _add_models(doc: dict[str, Any], models: tuple[type[BaseModel], ...]) -> None:
    """Add these models, and the models they use, to the document's components (those already there stay)."""
    _, schemas = models_json_schema([(m, "serialization") for m in models], ref_template=_REF)
    for name, schema in schemas.get("$defs", {}).items():
        doc["components"]["schemas"].setdefault(name, schema)


def _require_bearer(doc: dict[str, Any]) -> None:
    """Mark what APIKeyMiddleware guards: every operation under /v1/ (their 401 comes with the routers)."""
    doc["components"]["securitySchemes"] = {
        "bearer": {"type": "http", "scheme": "bearer", "description": "server.api_key"}
    }
    for path, item in doc["paths"].items():
        if path.startswith(PROTECTED_PREFIX):
            for operation in item.values():
                operation["security"] = [{"bearer": []}]
