"""Property-based requests generated from the server's own /openapi.json (schemathesis, valid and
invalid data): no answer may be a 5xx and every error body must be OpenAI-shaped.

The server runs with a 10 s request time limit, so a generated request that is valid but huge
(n=64, thousands of tokens) ends as a 408 instead of running for minutes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from serverkit import is_openai_error, serve  # noqa: E402

MAX_EXAMPLES = int(os.environ.get("ANYCORE_SCHEMA_EXAMPLES", "25"))  # per operation


@pytest.fixture(scope="module")
def schema_server(tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("schema") / "server.log"
    with serve(["--dtype", "float32", "--request-timeout", "10", "--max-request-body-mb", "1"], log) as srv:
        yield srv


@pytest.fixture(scope="module")
def api_schema(schema_server):
    return schemathesis.openapi.from_url(f"{schema_server.url}/openapi.json")


def test_openapi_lists_request_bodies(schema_server) -> None:
    """The generated cases are only as good as the schema: every POST route documents its body."""
    import httpx

    spec = httpx.get(f"{schema_server.url}/openapi.json", timeout=30).json()
    posts = {path: ops["post"] for path, ops in spec["paths"].items() if "post" in ops}
    assert set(posts) >= {"/v1/chat/completions", "/v1/completions", "/generate", "/tokenize", "/detokenize"}
    for path, op in posts.items():
        assert "application/json" in op["requestBody"]["content"], path


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_5xx_and_openai_shaped_errors(case, schema_server) -> None:
    response = case.call(base_url=schema_server.url, timeout=120)
    assert response.status_code < 500, f"{case.method} {case.path} -> {response.status_code}: {response.text[:300]}"
    if response.status_code >= 400:
        assert is_openai_error(response.json()), f"{case.method} {case.path}: {response.text[:300]}"
    assert schema_server.alive()
