"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}`` for every failure."""

from __future__ import annotations

import json
import logging
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("anycore.server")

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
          429: "rate_limit_error", 503: "service_unavailable", 500: "internal_error"}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "invalid_request_error")


def error_body(status: int, message: str, param: str | None = None, code: str | None = None,
               type: str | None = None) -> dict:
    return {"error": {"message": message, "type": type or _TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(error_body(err.status, err.message, err.param, err.code, err.type), status_code=err.status)


def from_value_error(e: ValueError) -> APIError:
    """A ValueError from SamplingParams/Engine validation; names the parameter when it can."""
    msg = str(e)
    m = re.match(r"invalid sampling parameter (\w+)=", msg)
    return APIError(400, msg, param=m.group(1) if m else None, code="invalid_value" if m else None)


def sse_error(err: APIError) -> str:
    """An error inside an already-started stream (headers are out, so no status code)."""
    return f"data: {json.dumps(error_body(err.status, err.message, err.param, err.code, err.type))}\n\n"


def _validation_error(exc: RequestValidationError) -> APIError:
    errors = exc.errors()
    if not errors:
        return APIError(400, "invalid request")
    first = errors[0]
    if first.get("type") == "json_invalid":
        return APIError(400, f"the request body is not valid JSON: {first.get('msg')}", code="invalid_json")
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    # unions report each alternative as a loc element; keep the field path only
    loc = [p for p in loc if not (p.startswith(("list[", "str", "int", "function-")) or "[" in p)]
    param = ".".join(loc) or None
    if first.get("type") == "missing":
        message = f"missing required parameter: '{param}'"
    elif first.get("type") == "model_attributes_type" and not loc:
        message = "the request body must be a JSON object, sent with 'Content-Type: application/json'"
    else:
        message = f"invalid value for '{param}': {first.get('msg')}" if param else str(first.get("msg"))
    return APIError(400, message, param=param, code="invalid_value" if param else None)


def install_error_handlers(app: FastAPI, on_error=None) -> None:
    def respond(err: APIError) -> JSONResponse:
        if on_error is not None:
            on_error(err.status)
        return error_response(err)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return respond(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return respond(_validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else None
        return respond(APIError(exc.status_code, str(exc.detail), code=code))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error serving %s", request.url.path)
        return respond(APIError(500, f"internal server error: {type(exc).__name__}: {exc}"))
