"""POST /v1/chat/completions and /v1/completions: OpenAI semantics over the AsyncEngine.

One HTTP request becomes a RequestGroup of sub-requests, made by the InputProcessor as for the
offline ``LLM`` (prompts x n, seeds seed+j); each output carries its choice index,
prompt_index * n + j.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from anycore.engine.input_processor import EngineRequest
from anycore.errors import InvalidRequest
from anycore.sampling_params import SamplingParams
from anycore.scheduler.request import TokenLogprob
from anycore.server.async_engine import RequestGroup
from anycore.server.context import ClientGone, ServerContext, until_disconnect
from anycore.server.errors import sse_error
from anycore.server.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from anycore.server.tool_calls import plan_tools


def get_ctx(request: Request) -> ServerContext:
    ctx: ServerContext = request.app.state.ctx
    ctx.check_auth(request)
    return ctx


Ctx = Annotated[ServerContext, Depends(get_ctx)]
router = APIRouter()


@dataclass
class _Choice:
    text: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    num_output_tokens: int = 0


@dataclass
class _Job:
    """A validated request, ready to submit."""

    rid: str
    model: str
    requests: list[EngineRequest]
    n: int
    prompt_tokens: int
    stream: bool
    include_usage: bool
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def num_choices(self) -> int:
        return len(self.requests)


def _job(ctx: ServerContext, rid: str, model: str, prompts: list[list[int]], params: SamplingParams,
         body: SamplingFields, param: str) -> _Job:
    requests = ctx.require_ready().process(rid, prompts, params, param=param, completion_must_fit=True)
    return _Job(rid, model, requests, params.n, sum(len(p) for p in prompts), body.stream,
                bool(body.stream_options and body.stream_options.include_usage))


def _usage(job: _Job, completion_tokens: int, cached: int) -> dict[str, Any]:
    return {"prompt_tokens": job.prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": job.prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _lp(x: float) -> float:
    return x if math.isfinite(x) else -9999.0


def _chat_logprobs(ctx: ServerContext, lps: list[TokenLogprob]) -> dict[str, Any]:
    def entry(tid: int, lp: float) -> dict[str, Any]:
        s = ctx.token_text(tid)
        return {"token": s, "logprob": _lp(lp), "bytes": list(s.encode("utf-8"))}

    return {"content": [{**entry(t.token_id, t.logprob), "top_logprobs": [entry(i, v) for i, v in t.top]}
                        for t in lps]}


def _completion_logprobs(ctx: ServerContext, lps: list[TokenLogprob], offset: int) -> dict[str, Any]:
    tokens, token_lps, tops, offsets = [], [], [], []
    for t in lps:
        s = ctx.token_text(t.token_id)
        tokens.append(s)
        token_lps.append(_lp(t.logprob))
        tops.append({ctx.token_text(i): _lp(v) for i, v in t.top})
        offsets.append(offset)
        offset += len(s)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


async def _collect(group: RequestGroup, job: _Job) -> tuple[list[_Choice], int]:
    choices = [_Choice() for _ in range(job.num_choices)]
    cached: dict[int, int] = {}
    async with group:
        async for out in group:
            if out.error is not None:
                raise out.error
            c = choices[out.index]
            c.text.append(out.delta_text)
            c.logprobs.extend(out.new_logprobs)
            c.num_output_tokens = out.num_output_tokens
            if out.finished:
                c.finish_reason = out.finish_reason
                cached[out.index // job.n] = out.num_cached_tokens
    return choices, sum(cached.values())


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _respond(request: Request, ctx: ServerContext, job: _Job, build, stream_chunks) -> Response:
    group = ctx.submit(job.requests)
    if job.stream:
        return StreamingResponse(stream_chunks(group), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                                 background=BackgroundTask(group.close))
    try:
        choices, cached = await until_disconnect(request, _collect(group, job))
    except ClientGone:
        return Response(status_code=499)
    finally:
        group.close()
    return JSONResponse(build(choices, cached))


# ---- chat ------------------------------------------------------------------------------------
@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request,
                           ctx: Ctx) -> Response:
    model = ctx.check_model(body.model)
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    if body.top_logprobs is not None and not body.logprobs:
        raise InvalidRequest("top_logprobs requires logprobs=true", param="top_logprobs")
    params = body.to_sampling_params(max_tokens, (body.top_logprobs or 0) if body.logprobs else None)
    tools = plan_tools(body, ctx.config.tool_call_parser, ctx.chat_template)
    if tools is not None:  # "required", a named function or a strict tool: their grammar
        params.structured_output = tools.structured_output() or params.structured_output
    ids = ctx.encode_chat(body.messages, body.add_generation_prompt, tools.tools if tools else None)
    job = _job(ctx, f"chatcmpl-{uuid.uuid4().hex}", model, [ids], params, body, "messages")
    await ctx.compile_grammar(params)
    want_lp = body.logprobs

    def message(c: _Choice) -> tuple[dict[str, Any], str | None]:
        text = "".join(c.text)
        return tools.message(text, c.finish_reason) if tools else ({"role": "assistant", "content": text},
                                                                   c.finish_reason)

    def build(choices: list[_Choice], cached: int) -> dict[str, Any]:
        return {
            "id": job.rid, "object": "chat.completion", "created": job.created, "model": job.model,
            "choices": [{
                "index": i,
                "message": msg,
                "logprobs": _chat_logprobs(ctx, c.logprobs) if want_lp else None,
                "finish_reason": reason,
            } for i, c in enumerate(choices) for msg, reason in [message(c)]],
            "usage": _usage(job, sum(c.num_output_tokens for c in choices), cached),
            "system_fingerprint": None,
        }

    def chunk(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> str:
        obj = {"id": job.rid, "object": "chat.completion.chunk", "created": job.created, "model": job.model,
               "choices": choices, "system_fingerprint": None}
        if job.include_usage:
            obj["usage"] = usage
        return _sse(obj)

    async def stream(group: RequestGroup):
        async with group:
            for i in range(job.num_choices):
                yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None}])
            completion_tokens, cached = 0, 0
            streamers = [tools.streamer() for _ in range(job.num_choices)] if tools else None
            async for out in group:
                if out.error is not None:
                    yield sse_error(out.error)
                    break
                i = out.index
                if streamers is not None:  # tool calls: deltas from the choice's ToolStreamer
                    deltas = streamers[i].feed(out.delta_text)
                    lp = _chat_logprobs(ctx, out.new_logprobs) if want_lp and out.new_logprobs else None
                    for k, delta in enumerate(deltas or ([{}] if lp else [])):
                        yield chunk([{"index": i, "delta": delta, "logprobs": lp if k == 0 else None,
                                      "finish_reason": None}])
                elif out.delta_text or (want_lp and out.new_logprobs):
                    yield chunk([{"index": i, "delta": {"content": out.delta_text},
                                  "logprobs": _chat_logprobs(ctx, out.new_logprobs) if want_lp else None,
                                  "finish_reason": None}])
                if out.finished:
                    completion_tokens += out.num_output_tokens
                    cached = out.num_cached_tokens
                    reason = out.finish_reason
                    if streamers is not None:
                        deltas, reason = streamers[i].finish(reason)
                        for delta in deltas:
                            yield chunk([{"index": i, "delta": delta, "logprobs": None, "finish_reason": None}])
                    yield chunk([{"index": i, "delta": {}, "logprobs": None, "finish_reason": reason}])
            else:
                if job.include_usage:
                    yield chunk([], _usage(job, completion_tokens, cached))
            yield "data: [DONE]\n\n"

    return await _respond(request, ctx, job, build, stream)


# ---- completions -----------------------------------------------------------------------------
@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request,
                      ctx: Ctx) -> Response:
    model = ctx.check_model(body.model)
    if body.echo:
        raise InvalidRequest("echo is not supported", param="echo")
    if body.suffix:
        raise InvalidRequest("suffix is not supported", param="suffix")
    if body.best_of is not None and body.best_of != body.n:
        raise InvalidRequest("best_of must equal n (or be omitted)", param="best_of")
    params = body.to_sampling_params(body.max_tokens, body.logprobs)
    inputs = ctx.require_ready()
    prompts = [inputs.encode_prompt(p) for p in inputs.split_prompts(body.prompt)]
    job = _job(ctx, f"cmpl-{uuid.uuid4().hex}", model, prompts, params, body, "prompt")
    await ctx.compile_grammar(params)
    want_lp = body.logprobs is not None

    def build(choices: list[_Choice], cached: int) -> dict[str, Any]:
        return {
            "id": job.rid, "object": "text_completion", "created": job.created, "model": job.model,
            "choices": [{
                "index": i, "text": "".join(c.text),
                "logprobs": _completion_logprobs(ctx, c.logprobs, 0) if want_lp else None,
                "finish_reason": c.finish_reason,
            } for i, c in enumerate(choices)],
            "usage": _usage(job, sum(c.num_output_tokens for c in choices), cached),
            "system_fingerprint": None,
        }

    def chunk(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> str:
        obj = {"id": job.rid, "object": "text_completion", "created": job.created, "model": job.model,
               "choices": choices, "system_fingerprint": None}
        if job.include_usage:
            obj["usage"] = usage
        return _sse(obj)

    async def stream(group: RequestGroup):
        offsets = [0] * job.num_choices
        async with group:
            completion_tokens, cached = 0, {}
            async for out in group:
                if out.error is not None:
                    yield sse_error(out.error)
                    break
                i = out.index
                if out.delta_text or out.finished or (want_lp and out.new_logprobs):
                    lp = _completion_logprobs(ctx, out.new_logprobs, offsets[i]) if want_lp else None
                    offsets[i] += sum(len(t) for t in lp["tokens"]) if lp else 0
                    yield chunk([{"index": i, "text": out.delta_text, "logprobs": lp,
                                  "finish_reason": out.finish_reason if out.finished else None}])
                if out.finished:
                    completion_tokens += out.num_output_tokens
                    cached[i // job.n] = out.num_cached_tokens
            else:
                if job.include_usage:
                    yield chunk([], _usage(job, completion_tokens, sum(cached.values())))
            yield "data: [DONE]\n\n"

    return await _respond(request, ctx, job, build, stream)
