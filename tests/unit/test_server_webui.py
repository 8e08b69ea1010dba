"""The web page's routes without a model: static files, /v1/engine's shape while not ready, /v1/bench
with and without --bench-results, and which of them need the API key.

The engine here fails to load at once (a factory that raises), so no model is read; the loaded
engine's fields are checked against the real model in tests/e2e/test_webui_browser.py.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from anycore.config import EngineConfig, ServerConfig
from anycore.server.app import build_app
from anycore.server.async_engine import AsyncEngine
from anycore.server.context import ServerContext

KEY = "unit-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 16  # enough of a PNG for a byte-for-byte round trip


def _no_model(config: EngineConfig):
    raise RuntimeError("no model in this test")


def _client(config: ServerConfig) -> TestClient:
    engine = AsyncEngine(EngineConfig(), max_queued_requests=None, engine_factory=_no_model)
    return TestClient(build_app(ServerContext(engine, config)), raise_server_exceptions=False)


@pytest.fixture()
def bench_file(tmp_path: Path) -> Path:
    path = tmp_path / "compare.json"
    path.write_text(json.dumps({"meta": {"started": "2026-01-01 00:00:00"}, "measurements": [
        {"workload": "decode c=1", "engine": "anycore bf16", "unit": "tok/s", "higher_is_better": True,
         "median": 50.0, "values": [49.0, 50.0, 51.0], "cv": 0.02, "noisy": False, "noise_reasons": []}]}))
    (tmp_path / "compare-decode.png").write_bytes(PNG)
    (tmp_path / "other-decode.png").write_bytes(PNG)  # another run's chart: not listed
    return path


def test_page_and_assets_load_without_a_key():
    with _client(ServerConfig(api_key=KEY)) as c:
        page = c.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert '<script src="/webui/app.js"' in page.text and 'id="prompt"' in page.text
        js = c.get("/webui/app.js")
        assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
        assert "/v1/chat/completions" in js.text
        assert c.get("/webui/style.css").headers["content-type"].startswith("text/css")
        missing = c.get("/webui/secret.py")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
        assert c.get("/webui/..%2Fapp.py").status_code == 404


def test_engine_info_needs_the_key_and_reports_a_failed_load():
    with _client(ServerConfig(api_key=KEY, served_model_names=("m",))) as c:
        assert c.get("/v1/engine").status_code == 401
        assert c.get("/v1/engine", headers={"Authorization": "Bearer wrong"}).status_code == 401
        for _ in range(100):  # the engine thread fails its load at once; wait for it to say so
            info = c.get("/v1/engine", headers=AUTH).json()
            if info["state"] == "failed":
                break
        assert info["state"] == "failed" and "no model in this test" in info["load_error"]
        assert info["model"] == "m" and info["kernels"] == {} and info["decoder_stack"] is None
        assert info["requests"] == {"running": 0, "waiting": 0, "queued": 0}
        assert info["kv"]["usage"] == 0.0 and info["prefix_cache"]["hit_rate"] == 0.0
        assert info["bench_results"] is False


def test_bench_results_and_charts(bench_file: Path):
    with _client(ServerConfig(api_key=KEY, bench_results=str(bench_file))) as c:
        assert c.get("/v1/bench").status_code == 401
        body = c.get("/v1/bench", headers=AUTH).json()
        assert body["file"] == "compare.json" and body["charts"] == ["compare-decode.png"]
        assert body["result"]["measurements"][0]["median"] == 50.0
        chart = c.get("/v1/bench/charts/compare-decode.png", headers=AUTH)
        assert chart.status_code == 200 and chart.headers["content-type"] == "image/png" and chart.content == PNG
        assert c.get("/v1/bench/charts/other-decode.png", headers=AUTH).status_code == 404
        assert c.get("/v1/bench/charts/..%2Fcompare.json", headers=AUTH).status_code == 404
        assert c.get("/v1/engine", headers=AUTH).json()["bench_results"] is True


def test_bench_without_the_flag_or_with_a_bad_file(tmp_path: Path):
    with _client(ServerConfig()) as c:
        r = c.get("/v1/bench")
        assert r.status_code == 404 and r.json()["error"]["code"] == "no_bench_results"
        assert "--bench-results" in r.json()["error"]["message"]
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a compare result"}')
    with _client(replace(ServerConfig(), bench_results=str(bad))) as c:
        r = c.get("/v1/bench")
        assert r.status_code == 500 and "measurements" in r.json()["error"]["message"]


def test_serve_flag_reaches_the_config(tmp_path: Path):
    from anycore.cli import build_parser, check_paths
    from anycore.server.args import server_config

    args = build_parser().parse_args(["serve", "--bench-results", str(tmp_path / "r.json")])
    assert server_config(args).bench_results == str(tmp_path / "r.json")
    with pytest.raises(FileNotFoundError, match="--bench-results"):
        check_paths(args)  # the file does not exist: one line before any model load


def test_readme_documents_every_engine_field():
    with _client(ServerConfig()) as c:
        info = c.get("/v1/engine").json()
    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    block = readme.split("`GET /v1/engine` (Bearer", 1)[1].split("`GET /v1/bench` answers", 1)[0]
    missing = [k for k in info if k != "object" and k not in block]
    missing += [f"{k}.{sub}" for k in ("requests", "kv", "prefix_cache", "totals") for sub in info[k] if sub not in block]
    assert missing == [], f"README's /v1/engine section lacks {missing}"
