"""Two ASGI guards around the whole app: a request body size limit and a per-request time limit.

Both are plain ASGI middlewares (no per-route code), so every endpoint gets them and the route
handlers stay unaware of them.

Body limit (``--max-request-body-mb``): a ``Content-Length`` above the limit is answered 413 before
a byte of the body is read; a chunked body is counted as it arrives and the read that crosses the
limit raises ``BodyTooLarge`` (a 413 HTTPException, which the app's handlers render OpenAI-shaped).

Time limit (``--request-timeout``): the request's whole handling (body read, generation, and a
stream's last byte) must end within the limit. When it does not, the handler task is cancelled,
which leaves every ``async with RequestGroup`` and so aborts the engine requests and frees their
KV slots. What the client then sees:
- nothing sent yet (non-streaming, or still reading the body): HTTP 408 with an OpenAI-shaped
  body, ``type "timeout_error"``, ``code "request_timeout"`` (the OpenAI client retries 408);
- a stream already started: one ``data: {"error": {...}}`` event with that body, then
  ``data: [DONE]`` - the same in-stream error shape as other failures after headers are out.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from fastapi import HTTPException

from anycore.errors import HTTPStatusError

log = logging.getLogger("anycore.server")

ASGIApp = Any
Scope = dict[str, Any]


class BodyTooLarge(HTTPException):
    """An HTTPException so FastAPI's body reader re-raises it (any other error there becomes a 400)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body exceeds the server's limit of {limit} bytes "
                              "(--max-request-body-mb)")


async def _send_json(send, status: int, body: dict) -> None:
    payload = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": payload, "more_body": False})


class BodySizeLimit:
    """Rejects HTTP request bodies larger than ``max_bytes`` with 413."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None:
            try:
                too_big = int(declared) > limit
            except ValueError:  # uvicorn rejects a malformed Content-Length before us; be safe anyway
                too_big = False
            if too_big:
                await _send_json(send, 413, HTTPStatusError(413, str(BodyTooLarge(limit).detail),
                                                            code="request_too_large").body())
                return
        received = 0

        async def counted_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        await self.app(scope, counted_receive, send)


class RequestTimeout:
    """Cancels an HTTP request's handling after ``seconds``; see the module docstring for the answer."""

    def __init__(self, app: ASGIApp, seconds: float) -> None:
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope: Scope, receive, send) -> None:
        if scope["type"] != "http" or self.seconds <= 0:
            await self.app(scope, receive, send)
            return
        state = {"started": False, "ended": False, "sse": False}

        async def tracked_send(message: dict) -> None:
            if state["ended"]:  # the timeout answer went out; the cancelled handler may not add to it
                return
            if message["type"] == "http.response.start":
                state["started"] = True
                ctype = dict(message.get("headers") or ()).get(b"content-type", b"")
                state["sse"] = ctype.startswith(b"text/event-stream")
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                state["ended"] = True
            await send(message)

        try:
            await asyncio.wait_for(self.app(scope, receive, tracked_send), self.seconds)
        except asyncio.TimeoutError:
            if state["ended"]:
                return
            message = f"the request did not finish within the server's limit of {self.seconds:g} s (--request-timeout)"
            body = HTTPStatusError(408, message, code="request_timeout", type="timeout_error").body()
            log.warning("request to %s timed out after %.0f s; aborted", scope.get("path"), self.seconds)
            state["ended"] = True
            if not state["started"]:
                await _send_json(send, 408, body)
            elif state["sse"]:
                chunk = f"data: {json.dumps(body)}\n\ndata: [DONE]\n\n".encode()
                await send({"type": "http.response.body", "body": chunk, "more_body": False})
            else:
                await send({"type": "http.response.body", "body": b"", "more_body": False})


def install_limits(app, max_body_bytes: int | None, request_timeout_s: float | None) -> None:
    """Wraps ``app`` (a Starlette/FastAPI app) in the guards whose limit is set (None or <= 0: off)."""
    # add_middleware wraps outermost last: the time limit covers the body-limit check as well
    if max_body_bytes is not None and max_body_bytes > 0:
        app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes)
    if request_timeout_s is not None and request_timeout_s > 0:
        app.add_middleware(RequestTimeout, seconds=request_timeout_s)
