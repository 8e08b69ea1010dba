"""The server's error handler renders every failure as an OpenAI error body with its own status."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel, Field

from anycore.errors import ContextLengthExceeded, Overloaded, ShuttingDown
from anycore.sampling_params import SamplingParams
from anycore.server.errors import install_error_handlers, sse_error


class Body(BaseModel):
    n: int = Field(1, ge=1)


@pytest.fixture(scope="module")
def client():
    statuses: list[int] = []
    app = FastAPI()
    install_error_handlers(app, on_error=statuses.append)

    @app.post("/raise/{kind}")
    async def raise_(kind: str, body: Body) -> dict:
        if kind == "context":
            raise ContextLengthExceeded("too long", param="prompt")
        if kind == "overloaded":
            raise Overloaded("busy")
        if kind == "param":
            SamplingParams(temperature=-1)
        if kind == "bug":
            raise RuntimeError("boom")
        return {"ok": True}

    with TestClient(app, raise_server_exceptions=False) as c:
        c.statuses = statuses
        yield c


@pytest.mark.parametrize("path,body,status,type_,param,code", [
    ("/raise/context", {}, 400, "invalid_request_error", "prompt", "context_length_exceeded"),
    ("/raise/overloaded", {}, 429, "rate_limit_error", None, "server_overloaded"),
    ("/raise/param", {}, 400, "invalid_request_error", "temperature", "invalid_value"),
    ("/raise/bug", {}, 500, "internal_error", None, None),
    ("/raise/none", {"n": 0}, 400, "invalid_request_error", "n", "invalid_value"),
    ("/nowhere", {}, 404, "invalid_request_error", None, "not_found"),
])
def test_error_bodies(client, path, body, status, type_, param, code):
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert (err["type"], err["param"], err["code"]) == (type_, param, code) and err["message"]
    assert client.statuses[-1] == status


def test_stream_error_event():
    event = sse_error(ShuttingDown("the server is shutting down"))
    assert event.startswith("data: ") and event.endswith("\n\n")
    assert '"code": "server_shutting_down"' in event and '"type": "service_unavailable"' in event
