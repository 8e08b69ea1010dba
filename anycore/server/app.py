"""The FastAPI app and ``run_server`` (what `anycore serve` calls).

uvicorn starts listening at once and the model loads on the engine thread, so /health answers
503 while loading and 200 once serving. SIGINT/SIGTERM: uvicorn stops accepting, lets in-flight
requests run for ``--shutdown-timeout`` seconds, cancels the rest (each cancelled request aborts
its engine request); then the lifespan hook stops and joins the engine thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse

from anycore.config import EngineConfig, ServerConfig
from anycore.errors import NotReady
from anycore.server import native_api, openai_api, render_api, webui
from anycore.server.async_engine import AsyncEngine
from anycore.server.context import ServerContext
from anycore.server.errors import install_error_handlers
from anycore.server.limits import install_limits
from anycore.server.openai_api import Ctx

log = logging.getLogger("anycore.server")


def build_app(ctx: ServerContext, on_failed=None, url: str = "", max_body_bytes: int | None = None,
              request_timeout_s: float | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        t0 = time.monotonic()

        def ready() -> None:
            ctx.on_engine_ready()
            e = ctx.engine
            log.info("ready in %.1fs: serving %s (dtype %s, max_model_len %d, KV %d slots = %.2f GiB) at %s",
                     time.monotonic() - t0, ", ".join(ctx.served_model_names), e.config.dtype,
                     ctx.max_model_len, e.stats.kv_slots_total, e.engine.kv_cache_gb, url or "(in-process)")

        def failed(message: str) -> None:
            log.error("%s", message)
            if on_failed is not None:
                on_failed(message)

        ctx.engine.start(loop, on_ready=ready, on_failed=failed)
        try:
            yield
        finally:
            log.info("shutting down: stopping the engine thread")
            await ctx.engine.shutdown()

    app = FastAPI(title="anycore", lifespan=lifespan)
    app.state.ctx = ctx
    install_error_handlers(app, on_error=ctx.engine.metrics.on_rejected)
    app.include_router(openai_api.router)
    app.include_router(native_api.router)
    app.include_router(render_api.router)
    app.include_router(webui.router)
    install_limits(app, max_body_bytes, request_timeout_s)

    @app.get("/health")
    async def health() -> JSONResponse:
        state = ctx.engine.state
        if state == "ready" and ctx.inputs is not None:
            return JSONResponse({"status": "ok"})
        msg = ctx.engine.load_error if state == "failed" else f"the model is {state}"
        return JSONResponse({**NotReady(msg or state).body(), "status": state}, status_code=503)

    @app.get("/v1/models")
    async def models(c: Ctx) -> dict[str, Any]:
        c.require_ready()
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": c.created, "owned_by": "anycore", "root": name,
             "max_model_len": c.max_model_len} for name in c.served_model_names
        ]}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        e = ctx.engine
        text = e.metrics.render(e.stats, e.num_snapshots, e.num_queued, ctx.model_name, e.is_ready)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


def run_server(config: ServerConfig, engine_config: EngineConfig) -> int:
    import uvicorn

    host, port, grace = config.host, config.port, config.shutdown_timeout
    engine = AsyncEngine(engine_config, max_queued_requests=config.max_queued_requests, self_check=config.self_check)
    ctx = ServerContext(engine, config)
    url = f"http://{host}:{port}"
    server: Any = None

    def on_failed(message: str) -> None:
        if server is not None:
            server.should_exit = True

    def on_first_signal() -> None:
        # runs in the signal handler: only schedule work on the loop
        loop = engine.loop
        if loop is not None and not loop.is_closed():
            log.info("shutdown requested: in-flight requests get %.0fs to finish", grace)
            loop.call_soon_threadsafe(loop.call_later, grace, engine.abort_all, "the server is shutting down")

    body_mb = config.max_request_body_mb
    app = build_app(ctx, on_failed=on_failed, url=url, max_body_bytes=int(body_mb * 1024 * 1024) if body_mb else None,
                    request_timeout_s=config.request_timeout or None)

    uv_config = uvicorn.Config(app, host=host, port=port, log_level=config.uvicorn_log_level,
                               timeout_graceful_shutdown=grace + 10.0,  # backstop; abort_all normally ends streams
                               timeout_keep_alive=30)
    server = _server_class()(uv_config, on_first_signal)
    log.info("listening on %s; loading model %s (dtype %s) - /health is 503 until it is ready",
             url, engine_config.model or "(default)", engine_config.dtype)
    server.run()
    return 1 if engine.state == "failed" else 0


def _server_class():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn.Server that exits 0 after a graceful stop and tells us when the first signal arrives."""

        def __init__(self, config: uvicorn.Config, on_first_signal) -> None:
            super().__init__(config)
            self._on_first_signal = on_first_signal

        def handle_exit(self, sig, frame) -> None:
            first = not self.should_exit
            super().handle_exit(sig, frame)
            # uvicorn re-raises captured signals after shutting down (exit status -N); a graceful stop
            # is a normal exit for service managers and tests, so do not
            captured = getattr(self, "_captured_signals", None)
            if isinstance(captured, list):
                captured.clear()
            if first:
                self._on_first_signal()

    return Server
