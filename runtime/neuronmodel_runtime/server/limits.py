"""What one request may cost: the body's size (server.max_request_bytes), and the request fields whose size the
schema leaves open (stop, logit_bias). The lengths (prompt tokens, max_tokens, n) are checked against the loaded
model's capacity in serving.py.

The body limit is a pure ASGI middleware, outermost, so that a body too large is refused before anything parses it
or checks its API key: by its Content-Length at once, or, for a chunked body, as soon as the bytes received pass
the limit. The rest of the body is never read.
"""

from __future__ import annotations

from typing import Any, Optional

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from neuronmodel_runtime.config import ServerConfig
from neuronmodel_runtime.server.errors import APIError, invalid


def _too_large(limit: int) -> APIError:
    return APIError(
        413,
        f"the request body is larger than {limit} bytes, the most this server accepts "
        "(server.max_request_bytes); send a smaller request",
        code="request_too_large",
    )


def _declared_length(scope: Scope) -> Optional[int]:
    """The Content-Length header as a number; None when absent or not a number (the body is counted instead)."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


class BodySizeLimitMiddleware:
    """413 with OpenAI's error body for a request body over `max_bytes`, before the app sees the request.

    The body (at most `max_bytes`) is read here and handed to the app as one message; after it, the app's receive
    calls reach the client's (so a disconnect is still seen while a response streams).
    """

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _declared_length(scope)
        if declared is not None and declared > self.max_bytes:
            await _too_large(self.max_bytes).response()(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left: the app sees that on its first receive
                replay: Message = message
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await _too_large(self.max_bytes).response()(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                replay = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
                break
        await self.app(scope, _replaying(replay, receive), send)


def _replaying(first: Message, receive: Receive) -> Receive:
    """A receive that answers `first` once, then the client's own messages."""
    pending = [first]

    async def replayed() -> Message:
        return pending.pop() if pending else await receive()

    return replayed


def check_request_size(req: Any, limits: ServerConfig) -> None:
    """400 naming the field for a `stop` or `logit_bias` larger than the server's limits."""
    stop = [req.stop] if isinstance(req.stop, str) else req.stop or []
    if len(stop) > limits.max_stop_sequences:
        raise invalid("stop", f"stop holds {len(stop)} strings; this server accepts at most "
                              f"{limits.max_stop_sequences} (server.max_stop_sequences)")
    longest = max((len(s) for s in stop), default=0)
    if longest > limits.max_stop_length:
        raise invalid("stop", f"stop strings may be at most {limits.max_stop_length} characters "
                              f"(server.max_stop_length), got one of {longest}")
    if req.logit_bias and len(req.logit_bias) > limits.max_logit_bias:
        raise invalid("logit_bias", f"logit_bias holds {len(req.logit_bias)} entries; this server accepts at "
                                    f"most {limits.max_logit_bias} (server.max_logit_bias)")
