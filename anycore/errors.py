"""Typed errors: each class carries the HTTP status and OpenAI ``type``/``code`` it answers with.

Raised where the problem is found (input processing, admission, the engine thread) and turned
into an OpenAI error body by the server's one handler, so no layer matches message strings.
Request errors subclass ValueError: offline callers of ``LLM`` catch them as ValueError.
"""

from __future__ import annotations

from typing import Any


class AnycoreError(Exception):
    """Base: ``status``, ``type`` and ``code`` default per class; ``param`` names the bad field."""

    status: int = 500
    type: str = "internal_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def body(self) -> dict[str, Any]:
        """The OpenAI error object: ``{"error": {"message", "type", "param", "code"}}``."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class InvalidRequest(AnycoreError, ValueError):
    """The request itself is unusable (bad field, empty prompt, token id out of range)."""

    status = 400
    type = "invalid_request_error"


class InvalidParameter(InvalidRequest):
    """A sampling parameter out of its range; ``param`` is its name."""

    code = "invalid_value"


class ContextLengthExceeded(InvalidRequest):
    """Prompt (plus the requested completion, where that must fit) exceeds ``max_model_len``."""

    code = "context_length_exceeded"


class Unauthorized(AnycoreError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class NotFound(AnycoreError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class ModelNotFound(NotFound):
    code = "model_not_found"


class Overloaded(AnycoreError):
    """Admission would exceed the server's queue limit; the client should retry later."""

    status = 429
    type = "rate_limit_error"
    code = "server_overloaded"


class NotReady(AnycoreError):
    """The model is loading or failed to load."""

    status = 503
    type = "service_unavailable"
    code = "model_not_ready"


class ShuttingDown(NotReady):
    """The server is stopping; in-flight requests end with this."""

    code = "server_shutting_down"


class EngineFailure(AnycoreError):
    """An engine step raised; the requests in flight at that moment fail with this."""


class HTTPStatusError(AnycoreError):
    """Any other status the HTTP layer answers with (routing errors, framework errors)."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str | None = None) -> None:
        super().__init__(message, param=param, code=code)
        self.status = status
        self.type = type or ("invalid_request_error" if 400 <= status < 500 else "internal_error")
