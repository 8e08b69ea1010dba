"""Typed errors carry their HTTP status and OpenAI body; the CLI's defaults are the config dataclasses'."""

from __future__ import annotations

import pytest

from anycore.cli import build_parser, engine_config
from anycore.config import EngineConfig, ServerConfig, default_of
from anycore.errors import (
    AnycoreError,
    ContextLengthExceeded,
    EngineFailure,
    HTTPStatusError,
    InvalidParameter,
    InvalidRequest,
    ModelNotFound,
    NotReady,
    Overloaded,
    ShuttingDown,
    Unauthorized,
)
from anycore.server.args import server_config


@pytest.mark.parametrize("cls,status,type_,code", [
    (InvalidRequest, 400, "invalid_request_error", None),
    (InvalidParameter, 400, "invalid_request_error", "invalid_value"),
    (ContextLengthExceeded, 400, "invalid_request_error", "context_length_exceeded"),
    (Unauthorized, 401, "invalid_request_error", "invalid_api_key"),
    (ModelNotFound, 404, "invalid_request_error", "model_not_found"),
    (Overloaded, 429, "rate_limit_error", "server_overloaded"),
    (NotReady, 503, "service_unavailable", "model_not_ready"),
    (ShuttingDown, 503, "service_unavailable", "server_shutting_down"),
    (EngineFailure, 500, "internal_error", None),
])
def test_status_type_and_code(cls, status, type_, code):
    err = cls("went wrong", param="p")
    assert (err.status, err.type, err.code) == (status, type_, code)
    assert err.body() == {"error": {"message": "went wrong", "type": type_, "param": "p", "code": code}}
    assert isinstance(err, AnycoreError) and str(err) == "went wrong"


def test_request_errors_are_value_errors_and_code_overrides():
    assert issubclass(InvalidRequest, ValueError) and not issubclass(Overloaded, ValueError)
    assert InvalidRequest("bad json", code="invalid_json").code == "invalid_json"
    assert InvalidRequest("x").code is None  # the override is per instance
    e = HTTPStatusError(405, "Method Not Allowed")
    assert (e.status, e.type) == (405, "invalid_request_error")
    assert HTTPStatusError(502, "upstream").type == "internal_error"


def test_cli_defaults_are_the_dataclass_defaults():
    args = build_parser().parse_args(["serve"])
    assert engine_config(args) == EngineConfig()
    assert server_config(args) == ServerConfig()
    args = build_parser().parse_args(["serve", "--no-prefix-caching", "--served-model-name", "a", "b",
                                      "--max-queued-requests", "3", "--decode-burst", "1"])
    e, s = engine_config(args), server_config(args)
    assert not e.enable_prefix_caching and e.decode_burst == 1 and e.adaptive_threads
    assert s.served_model_names == ("a", "b") and s.max_queued_requests == 3


def test_default_of_and_server_config_checks():
    assert default_of(ServerConfig, "max_queued_requests") == 256
    with pytest.raises(KeyError):
        default_of(ServerConfig, "nope")
    with pytest.raises(ValueError, match="max_queued_requests"):
        ServerConfig(max_queued_requests=0)
