"""POST /v1/chat/completions and /v1/completions: OpenAI semantics over the AsyncEngine.

One HTTP request becomes a RequestGroup of sub-requests, made by the InputProcessor as for the
offline ``LLM`` (prompts x n, seeds seed+j); each output carries its choice index,
prompt_index * n + j.
"""

from __future__ import annotations

import dataclasses
import json
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
from anycore.server import logprobs_format as fmt
from anycore.server.async_engine import RequestGroup
from anycore.server.context import ClientGone, ServerContext, until_disconnect
from anycore.server.errors import sse_error
from anycore.server.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from anycore.server.tool_calls import plan_tools
from anycore.server.usage import UsageCounter, usage_dict


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
    prompt_logprobs: list[TokenLogprob | None] | None = None  # (SamplingParams.prompt_logprobs)
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
    continuous_usage: bool  # stream_options.continuous_usage_stats: running usage on every chunk
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def num_choices(self) -> int:
        return len(self.requests)


def _job(ctx: ServerContext, rid: str, model: str, prompts: list[list[int]], params: SamplingParams,
         body: SamplingFields, param: str) -> _Job:
    opts = body.stream_options
    if opts is not None and opts.continuous_usage_stats and not (body.stream and opts.include_usage):
        raise InvalidRequest("stream_options.continuous_usage_stats needs stream=true and include_usage=true",
                             param="stream_options.continuous_usage_stats")
    if body.prompt_logprobs is not None and body.stream:  # (as vLLM: they come with the whole answer only)
        raise InvalidRequest("prompt_logprobs is not available with stream=true", param="prompt_logprobs")
    requests = ctx.require_ready().process(rid, prompts, params, param=param, completion_must_fit=True)
    return _Job(rid, model, requests, params.n, sum(len(p) for p in prompts), body.stream,
                bool(opts and opts.include_usage), bool(opts and opts.continuous_usage_stats))


def _usage(job: _Job, completion_tokens: int, cached: int) -> dict[str, Any]:
    return usage_dict(job.prompt_tokens, completion_tokens, cached)


_lp = fmt.finite


def _chat_logprobs(ctx: ServerContext, lps: list[TokenLogprob]) -> dict[str, Any]:
    """Chat's ``top_logprobs`` lists the top_logprobs likeliest tokens only (OpenAI and vLLM):
    ``top_logprobs=0`` gives ``[]``, while the sampled token's own logprob is always the entry's
    ``logprob``. (Legacy completions differ: their top dicts include the sampled token, see
    logprobs_format.py.)"""
    def entry(tid: int, lp: float) -> dict[str, Any]:
        s = ctx.token_text(tid)
        return {"token": s, "logprob": _lp(lp), "bytes": list(s.encode("utf-8"))}

    return {"content": [{**entry(t.token_id, t.logprob), "top_logprobs": [entry(i, v) for i, v in t.top]}
                        for t in lps]}


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
            if out.prompt_logprobs is not None:
                c.prompt_logprobs = out.prompt_logprobs
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
    body.log_unknown_fields("/v1/chat/completions")
    body.check_unsupported()
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
            # vLLM: on the response (one prompt); the first sample's (every sample has the same)
            **({"prompt_logprobs": fmt.vllm_prompt_logprobs(ctx.token_text, choices[0].prompt_logprobs or [],
                                                            body.prompt_logprobs)}
               if body.prompt_logprobs is not None else {}),
        }

    def chunk(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> str:
        if job.continuous_usage and usage is None:
            usage = counter.as_dict()
        obj = {"id": job.rid, "object": "chat.completion.chunk", "created": job.created, "model": job.model,
               "choices": choices, "system_fingerprint": None}
        if job.include_usage:
            obj["usage"] = usage
        return _sse(obj)

    counter = UsageCounter(job.prompt_tokens, job.n)

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
                counter.add(out)
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
    body.log_unknown_fields("/v1/completions")
    if body.suffix:
        raise InvalidRequest("suffix is not supported", param="suffix")
    if body.best_of is not None and body.best_of != body.n:
        raise InvalidRequest("best_of must equal n (or be omitted)", param="best_of")
    if body.max_tokens == 0 and not body.echo:
        raise InvalidRequest("max_tokens=0 generates nothing; it is only allowed with echo=true", param="max_tokens")
    params = body.to_sampling_params(body.max_tokens, body.logprobs)
    echo_lp = body.echo and body.logprobs is not None
    if echo_lp:  # the echoed prompt's logprobs: the same top-k as the generated tokens'
        params = dataclasses.replace(params, prompt_logprobs=max(body.logprobs or 0, body.prompt_logprobs or 0))
    inputs = ctx.require_ready()
    raw_prompts = inputs.split_prompts(body.prompt)
    prompts = [inputs.encode_prompt(p) for p in raw_prompts]
    job = _job(ctx, f"cmpl-{uuid.uuid4().hex}", model, prompts, params, body, "prompt")
    await ctx.compile_grammar(params)
    want_lp = body.logprobs is not None
    num_top = body.logprobs or 0
    # the echoed text: a text prompt as sent, a token-id prompt decoded
    echo_texts = [p if isinstance(p, str) else inputs.tokenizer.decode(p) for p in raw_prompts] if body.echo else []

    def prompt_of(i: int) -> int:
        return i // job.n

    def logprobs_obj(i: int, prompt_lps, lps: list[TokenLogprob], offset: int) -> dict[str, Any]:
        positions = fmt.prompt_positions(prompts[prompt_of(i)], prompt_lps) if prompt_lps is not None else []
        return fmt.completion_logprobs(ctx.token_text, positions + fmt.output_positions(lps), num_top, offset)

    def vllm_prompt_lps(prompt_lps) -> list | None:
        return fmt.vllm_prompt_logprobs(ctx.token_text, prompt_lps, body.prompt_logprobs or 0)

    def build(choices: list[_Choice], cached: int) -> dict[str, Any]:
        out_choices = []
        for i, c in enumerate(choices):
            choice = {
                "index": i, "text": (echo_texts[prompt_of(i)] if body.echo else "") + "".join(c.text),
                "logprobs": logprobs_obj(i, c.prompt_logprobs if echo_lp else None, c.logprobs, 0) if want_lp else None,
                "finish_reason": c.finish_reason,
            }
            if body.prompt_logprobs is not None:
                choice["prompt_logprobs"] = vllm_prompt_lps(c.prompt_logprobs or [])
            out_choices.append(choice)
        return {
            "id": job.rid, "object": "text_completion", "created": job.created, "model": job.model,
            "choices": out_choices,
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
        echoed = [not body.echo] * job.num_choices  # the choice's first chunk (with the prompt) went out
        counter = UsageCounter(job.prompt_tokens, job.n)
        async with group:
            async for out in group:
                if out.error is not None:
                    yield sse_error(out.error)
                    break
                i = out.index
                counter.add(out)
                first = not echoed[i]  # (echo only: this chunk also carries the prompt)
                if first or out.delta_text or out.finished or (want_lp and out.new_logprobs):
                    echoed[i] = True
                    text = (echo_texts[prompt_of(i)] if first else "") + out.delta_text
                    lp = None
                    if want_lp:
                        lp = logprobs_obj(i, out.prompt_logprobs if echo_lp and first else None, out.new_logprobs,
                                          offsets[i])
                        offsets[i] += fmt.text_length(lp)
                    yield chunk([{"index": i, "text": text, "logprobs": lp,
                                  "finish_reason": out.finish_reason if out.finished else None}],
                                counter.as_dict() if job.continuous_usage else None)
            else:
                if job.include_usage:
                    yield chunk([], counter.as_dict())
            yield "data: [DONE]\n\n"

    return await _respond(request, ctx, job, build, stream)
