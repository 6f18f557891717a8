"""`create_app(engine, config)`: the FastAPI application around one AsyncEngine.

The lifespan starts the engine's step loop on the server's event loop and shuts it down after uvicorn has
drained the connections. Routers stay thin: they fetch the serving objects from `app.state`.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from fastapi import FastAPI

from neuronmodel_runtime.config import RuntimeConfig
from neuronmodel_runtime.server import routes_chat, routes_completions, routes_health, routes_models
from neuronmodel_runtime.server.auth import APIKeyMiddleware
from neuronmodel_runtime.server.errors import install_error_handlers
from neuronmodel_runtime.server.metrics import Metrics
from neuronmodel_runtime.server.serving import Serving
from neuronmodel_runtime.server.serving_chat import ChatServing
from neuronmodel_runtime.server.serving_completions import CompletionServing


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

    app = FastAPI(title="neuronmodel", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    serving = Serving(engine, config, Metrics(engine, engine.model_name))
    app.state.serving = serving
    app.state.metrics = serving.metrics
    app.state.completions = CompletionServing(serving)
    app.state.chat = ChatServing(serving)
    install_error_handlers(app)
    if config.server.api_key is not None:
        app.add_middleware(APIKeyMiddleware, api_key=config.server.api_key.get_secret_value())
    for module in (routes_completions, routes_chat, routes_models, routes_health):
        app.include_router(module.router)
    return app
