"""Native endpoints: POST /generate (text or ids in, text and ids out), /tokenize, /detokenize.

/generate body: ``{"text": str | "input_ids": [int], "sampling_params": {...}, "stream": bool}``.
Answer: ``{"text", "output_ids", "meta_info": {"id", "finish_reason", "prompt_tokens",
"completion_tokens", "cached_tokens"[, "output_token_logprobs"]}}``; streamed, each SSE event
carries the new text and ids since the previous event, then ``data: [DONE]``.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from anycore.sampling_params import SamplingParams
from anycore.server.async_engine import RequestGroup
from anycore.server.context import ClientGone, output_error, until_disconnect
from anycore.server.errors import APIError, from_value_error, sse_error
from anycore.server.openai_api import Ctx
from anycore.server.protocol import DetokenizeRequest, GenerateRequest, TokenizeRequest

router = APIRouter()


def _meta(rid: str, out_reason: str | None, prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {"id": rid, "finish_reason": out_reason, "prompt_tokens": prompt, "completion_tokens": completion,
            "cached_tokens": cached}


@router.post("/generate")
async def generate(body: GenerateRequest, request: Request, ctx: Ctx) -> Response:
    ctx.require_ready()
    if (body.text is None) == (body.input_ids is None):
        raise APIError(400, "give exactly one of 'text' or 'input_ids'", param="text")
    ids = ctx.encode_text(body.text) if body.text is not None else list(body.input_ids or [])
    sp = body.sampling_params
    max_tokens = sp.max_new_tokens if sp.max_new_tokens is not None else (sp.max_tokens or 16)
    try:
        params = SamplingParams(
            temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k, min_p=sp.min_p,
            repetition_penalty=sp.repetition_penalty, frequency_penalty=sp.frequency_penalty,
            presence_penalty=sp.presence_penalty, seed=sp.seed, max_tokens=max_tokens, min_tokens=sp.min_tokens,
            stop=sp.stop, stop_token_ids=sp.stop_token_ids or [], ignore_eos=sp.ignore_eos, logprobs=sp.logprobs,
            skip_special_tokens=sp.skip_special_tokens, include_stop_str_in_output=sp.include_stop_str_in_output,
        )
    except ValueError as e:
        raise from_value_error(e) from e
    ctx.check_prompt(ids, max_tokens, "input_ids" if body.text is None else "text")
    rid = body.rid or f"gen-{uuid.uuid4().hex}"
    group = ctx.submit([(rid, ids, params)])
    want_lp = sp.logprobs is not None

    def lps(out) -> list[list[Any]]:
        return [[t.logprob, t.token_id, ctx.token_text(t.token_id)] for t in out.new_logprobs]

    if body.stream:
        async def stream(group: RequestGroup):
            async with group:
                async for out in group:
                    if out.error is not None:
                        yield sse_error(output_error(out.error))
                        break
                    meta = _meta(rid, out.finish_reason, out.num_prompt_tokens, out.num_output_tokens,
                                 out.num_cached_tokens)
                    if want_lp:
                        meta["output_token_logprobs"] = lps(out)
                    event = {"text": out.delta_text, "output_ids": out.new_token_ids, "finished": out.finished,
                             "meta_info": meta}
                    yield f"data: {json.dumps(event, ensure_ascii=False)}\n\n"
                yield "data: [DONE]\n\n"

        return StreamingResponse(stream(group), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"}, background=BackgroundTask(group.close))

    async def collect() -> dict[str, Any]:
        text, out_ids, logprobs, last = [], [], [], None
        async with group:
            async for out in group:
                if out.error is not None:
                    raise output_error(out.error)
                text.append(out.delta_text)
                out_ids.extend(out.new_token_ids)
                if want_lp:
                    logprobs.extend(lps(out))
                last = out
        assert last is not None
        meta = _meta(rid, last.finish_reason, last.num_prompt_tokens, last.num_output_tokens, last.num_cached_tokens)
        if want_lp:
            meta["output_token_logprobs"] = logprobs
        return {"text": "".join(text), "output_ids": out_ids, "meta_info": meta}

    try:
        result = await until_disconnect(request, collect())
    except ClientGone:
        return Response(status_code=499)
    finally:
        group.close()
    return JSONResponse(result)


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, ctx: Ctx) -> dict[str, Any]:
    ctx.check_model(body.model)
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "give exactly one of 'prompt' or 'messages'", param="prompt")
    if body.messages is not None:
        if not body.messages:
            raise APIError(400, "messages is empty", param="messages")
        ids = ctx.encode_chat(body.messages, body.add_generation_prompt)
    else:
        ids = ctx.encode_text(body.prompt or "", add_special_tokens=body.add_special_tokens)
    return {"tokens": ids, "count": len(ids), "max_model_len": ctx.max_model_len}


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, ctx: Ctx) -> dict[str, Any]:
    ctx.check_model(body.model)
    if any(t < 0 or t >= ctx.vocab_size for t in body.tokens):
        raise APIError(400, f"token ids must be in [0, {ctx.vocab_size})", param="tokens")
    return {"prompt": ctx.tokenizer.decode(body.tokens)}
