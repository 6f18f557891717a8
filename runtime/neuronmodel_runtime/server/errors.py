"""OpenAI's error JSON, and the exception handlers that turn every failure into it.

Every error body is `{"error": {"message", "type", "param", "code"}}` (`ErrorResponse`, also the schema the
OpenAPI document gives for every error status). Bad input is always a 4xx whose message names the field;
FastAPI's default 422 shape never reaches a client.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)

#: OpenAI's `type` per status class.
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
          429: "rate_limit_error", 503: "service_unavailable"}

#: What each error status means on the generation and model routes (the OpenAPI document's descriptions).
_MEANINGS = {
    400: "Invalid request: `param` names the field, `message` says what is accepted.",
    401: "Missing or invalid API key: send `Authorization: Bearer <key>`.",
    404: "The model does not exist on this server (`code`: model_not_found).",
    413: "The request body is larger than server.max_request_bytes (`code`: request_too_large).",
    429: "The waiting queue is full (`code`: queue_full): retry after `Retry-After` seconds.",
    500: "The engine failed on this request (`code`: engine_error); the server keeps serving others.",
    503: "Not accepting requests: loading, draining for shutdown (`code`: draining), or the engine stopped.",
}
_RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "integer"}}}


class ErrorDetail(BaseModel):
    message: str = Field(description="What went wrong and what to do about it.")
    type: str = Field(description="OpenAI's class: invalid_request_error, authentication_error, rate_limit_error, "
                                  "service_unavailable or server_error.")
    param: Optional[str] = Field(None, description="The request field at fault, e.g. `messages[0].role`.")
    code: Optional[str] = Field(None, description="Machine-readable reason, e.g. invalid_value, queue_full.")


class ErrorResponse(BaseModel):
    """OpenAI's error body."""

    error: ErrorDetail


def error_response(description: str, **extra: Any) -> dict[str, Any]:
    """One OpenAPI `responses=` entry answered with ErrorResponse (documentation only: handlers raise APIError)."""
    return {"model": ErrorResponse, "description": description, **extra}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` entries for these statuses, with their usual meaning."""
    return {s: error_response(_MEANINGS[s], **({"headers": _RETRY_AFTER} if s == 429 else {})) for s in statuses}


class APIError(Exception):
    """An error answered with OpenAI's error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: Optional[str] = None,
        code: Optional[str] = None,
        headers: Optional[dict[str, str]] = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers

    def response(self) -> JSONResponse:
        body = error_body(self.status, self.message, param=self.param, code=self.code)
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def error_body(status: int, message: str, *, param: Optional[str] = None, code: Optional[str] = None
               ) -> dict[str, Any]:
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return ErrorResponse(error=ErrorDetail(message=message, type=kind, param=param, code=code)).model_dump()


def invalid(param: Optional[str], message: str) -> APIError:
    """A 400 about one request field."""
    return APIError(400, message, param=param, code="invalid_value" if param else None)


def _param_of(loc: tuple) -> str:
    """('body', 'messages', 0, 'role') -> 'messages[0].role'."""
    out = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _validation_error(exc: RequestValidationError) -> APIError:
    # The deepest error is the most specific one (a union reports one error per member).
    err = max(exc.errors(), key=lambda e: len(e["loc"]))
    if err["type"] == "json_invalid":
        return invalid(None, f"the request body is not valid JSON: {err.get('ctx', {}).get('error', err['msg'])}")
    # Drop pydantic's union-member and validator tags (e.g. "str", "function-after[...]") from the location.
    loc = tuple(p for p in err["loc"] if isinstance(p, int) or ("[" not in p and p not in ("str", "int")))
    param = _param_of(loc)
    if not param:
        return invalid(None, "the request body must be a JSON object (Content-Type: application/json)")
    if err["type"] == "missing":
        return invalid(param, f"{param} is required")
    if err["type"] == "too_short":
        return invalid(param, f"{param} must not be empty")
    msg = err["msg"].removeprefix("Value error, ")
    return invalid(param, msg if msg.startswith(str(loc[-1])) else f"{param}: {msg}")


async def _on_api_error(_: Request, exc: APIError) -> JSONResponse:
    return exc.response()


async def _on_validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    return _validation_error(exc).response()


async def _on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    message = f"{request.method} {request.url.path}: {exc.detail}"
    return APIError(exc.status_code, message, headers=getattr(exc, "headers", None)).response()


async def _on_unexpected(_: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error: %s", type(exc).__name__)
    return APIError(500, f"internal server error ({type(exc).__name__})").response()


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _on_api_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(Exception, _on_unexpected)
