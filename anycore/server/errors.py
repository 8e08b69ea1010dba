"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}`` for every failure.

Every failure reaches the client as an ``AnycoreError`` (anycore/errors.py), which carries its
own status, type and code; this module only converts the framework's own errors into those.
"""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from anycore.errors import AnycoreError, HTTPStatusError, InvalidParameter, InvalidRequest

log = logging.getLogger("anycore.server")


def error_response(err: AnycoreError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status)


def sse_error(err: AnycoreError) -> str:
    """An error inside an already-started stream (headers are out, so no status code)."""
    return f"data: {json.dumps(err.body())}\n\n"


def _validation_error(exc: RequestValidationError) -> InvalidRequest:
    errors = exc.errors()
    if not errors:
        return InvalidRequest("invalid request")
    first = errors[0]
    if first.get("type") == "json_invalid":
        return InvalidRequest(f"the request body is not valid JSON: {first.get('msg')}", code="invalid_json")
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
    return InvalidParameter(message, param=param) if param else InvalidRequest(message)


def install_error_handlers(app: FastAPI, on_error=None) -> None:
    def respond(err: AnycoreError) -> JSONResponse:
        if on_error is not None:
            on_error(err.status)
        return error_response(err)

    @app.exception_handler(AnycoreError)
    async def _typed(request: Request, exc: AnycoreError) -> JSONResponse:
        return respond(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return respond(_validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else None
        return respond(HTTPStatusError(exc.status_code, str(exc.detail), code=code))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error serving %s", request.url.path)
        return respond(AnycoreError(f"internal server error: {type(exc).__name__}: {exc}"))
