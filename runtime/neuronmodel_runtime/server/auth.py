"""Optional bearer API key on /v1/*; /health, /ready and /metrics stay open for probes and scrapers.

A pure ASGI middleware (not BaseHTTPMiddleware, which would wrap streaming responses), so a request is
refused before its body is read. The key is compared in constant time and never logged.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from neuronmodel_runtime.server.errors import APIError

PROTECTED_PREFIX = "/v1/"


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self._expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(PROTECTED_PREFIX):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                error = APIError(
                    401,
                    "missing or invalid API key: send the header 'Authorization: Bearer <key>'",
                    code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                )
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
