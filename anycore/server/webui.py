"""The built-in web page and the two JSON endpoints it reads besides the OpenAI routes.

- ``GET /`` and ``GET /webui/<file>``: the chat page (static files shipped in the package,
  anycore/server/static/). They need no API key: the page itself asks for one when an API call
  answers 401, and sends it as a Bearer token.
- ``GET /v1/engine``: what the engine is and is doing (model, dtype, quantization, the kernel
  chosen per op, KV pool use, prefix-cache hits, running and waiting requests, token counters).
  Auth like the other /v1 routes. Answers while the model loads too (``state`` says so; the
  fields that need the loaded engine are then null).
- ``GET /v1/bench``: the ``anycore bench compare --json`` file given to ``--bench-results``, with
  the names of the PNG charts written next to it; ``GET /v1/bench/charts/<name>``: one chart.
  Both 404 (OpenAI-shaped) when the server was started without the flag.
"""

from __future__ import annotations

import json
import time
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from fastapi import APIRouter
from fastapi.responses import FileResponse, Response

from anycore.errors import AnycoreError, NotFound
from anycore.server.context import ServerContext
from anycore.server.openai_api import Ctx

router = APIRouter()

# the page's files: name -> media type (only these are served, so no path is ever joined from input)
_ASSETS = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
           "style.css": "text/css; charset=utf-8"}
_STARTED = time.time()


class BenchResultsUnreadable(AnycoreError):
    status = 500
    type = "internal_error"
    code = "bench_results_unreadable"


def _asset(name: str) -> Response:
    if name not in _ASSETS:
        raise NotFound(f"no web page file {name!r}")
    data = resources.files("anycore.server").joinpath("static", name).read_bytes()
    # no-cache: the page revalidates, so an upgraded server never runs a stale app.js
    return Response(data, media_type=_ASSETS[name], headers={"Cache-Control": "no-cache"})


@router.get("/", include_in_schema=False)
async def index() -> Response:
    return _asset("index.html")


@router.get("/webui/{name}", include_in_schema=False)
async def asset(name: str) -> Response:
    return _asset(name)


def engine_info(ctx: ServerContext) -> dict[str, Any]:
    """The /v1/engine body (a plain dict so tests and scripts read the same shape)."""
    ae = ctx.engine
    stats = ae.stats
    m = ae.metrics
    ready = ae.is_ready and ctx.inputs is not None
    total = stats.kv_slots_total
    queried = stats.prefix_queried_tokens
    info: dict[str, Any] = {
        "object": "engine",
        "state": ae.state,
        "load_error": ae.load_error if ae.state == "failed" else None,
        "model": ctx.model_name,
        "served_model_names": ctx.served_model_names,
        "uptime_s": round(time.time() - _STARTED, 3),
        "model_file": None, "architecture": None, "num_params": None, "dtype": ae.config.dtype,
        "quantization": None, "max_model_len": None, "kv_cache_gb": None, "threads": torch.get_num_threads(),
        "kernels": {}, "decoder_stack": None,
        "requests": {"running": stats.num_running, "waiting": stats.num_waiting, "queued": ae.num_queued},
        "kv": {"slots_total": total, "slots_used": stats.kv_slots_used, "slots_held": stats.kv_slots_held,
               "slots_cached": stats.kv_slots_cached,
               "usage": stats.kv_slots_held / total if total else 0.0,
               # sliding-window layers' own pool (0 and 0 when every layer keeps every position)
               "window_slots_total": stats.kv_window_slots_total, "window_slots_used": stats.kv_window_slots_used,
               "layout": None},
        "prefix_cache": {"enabled": ae.config.enable_prefix_caching, "queried_tokens": queried,
                         "hit_tokens": stats.prefix_hit_tokens,
                         "hit_rate": stats.prefix_hit_tokens / queried if queried else 0.0},
        "num_preemptions": stats.num_preemptions,
        "totals": {"requests_received": m.requests_received, "requests_finished": sum(m.requests_finished.values()),
                   "prompt_tokens": m.prompt_tokens, "cached_prompt_tokens": m.cached_prompt_tokens,
                   "generation_tokens": m.generation_tokens},
        "bench_results": ctx.config.bench_results is not None,
        # the start-up decode self-check (engine/self_check.py); null until it ran, or with --no-self-check
        "self_check": ae.self_check.as_dict() if ae.self_check is not None else None,
    }
    if ready:
        # only what the load fixed (config, sizes, the kernel table), never live engine state,
        # which the engine thread alone touches; the live numbers above are its stats snapshot
        eng = ae.engine
        ops = eng.ops
        info["kv"]["layout"] = eng.kv_layout  # which layers keep which KV (anycore/engine/engine.py kv_layout)
        info.update({
            "model_file": eng.model_name, "architecture": eng.model_config.architecture,
            "num_params": eng.num_params, "dtype": str(eng.dtype).removeprefix("torch."),
            "quantization": eng.quantization, "max_model_len": ctx.max_model_len,
            "kv_cache_gb": eng.kv_cache_gb,
            "kernels": {op: {"impl": impl, "reason": ops.reasons.get(op, "")} for op, impl in ops.choices.items()},
            # all layers in one native call, or op by op from Python (`anycore doctor` says which and why)
            "decoder_stack": "native" if ops.decoder_stack is not None and eng.parallel is None else "op by op",
            # per-rank placement (cores, threads) of a tensor-parallel engine; null for TP=1
            "tensor_parallel": None if eng.parallel is None else {
                "size": eng.config.tensor_parallel_size, "nnodes": eng.config.nnodes,
                "ranks": [p.describe() for p in eng.parallel.placements],
                "all_reduce": eng.parallel.group.all_reduce_name(),
                "failure": eng.parallel.group.failure},
        })
    return info


@router.get("/v1/engine")
async def engine(c: Ctx) -> dict[str, Any]:
    return engine_info(c)


def _bench_path(ctx: ServerContext) -> Path:
    path = ctx.config.bench_results
    if path is None:
        raise NotFound("this server has no benchmark results; start it with --bench-results FILE "
                       "(a JSON written by `anycore bench compare --json`)", code="no_bench_results")
    return Path(path)


def bench_charts(results: Path) -> list[str]:
    """The PNG charts `anycore bench compare` writes next to its JSON: ``<stem>-<group>.png``."""
    return sorted(p.name for p in results.parent.glob(f"{results.stem}-*.png") if p.is_file())


@router.get("/v1/bench")
async def bench(c: Ctx) -> dict[str, Any]:
    path = _bench_path(c)
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BenchResultsUnreadable(f"cannot read the benchmark results {path}: {e}") from None
    if not isinstance(result, dict) or not isinstance(result.get("measurements"), list):
        raise BenchResultsUnreadable(f"{path} is not an `anycore bench compare --json` file (no 'measurements' list)")
    return {"object": "bench_results", "file": path.name, "charts": bench_charts(path), "result": result}


@router.get("/v1/bench/charts/{name}")
async def bench_chart(name: str, c: Ctx) -> Response:
    path = _bench_path(c)
    if name not in bench_charts(path):  # only the listed files: no path is joined from input
        raise NotFound(f"no chart {name!r} next to {path.name}")
    return FileResponse(path.parent / name, media_type="image/png")
