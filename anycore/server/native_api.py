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

from anycore.errors import InvalidRequest
from anycore.server.async_engine import RequestGroup
from anycore.server.context import ClientGone, until_disconnect
from anycore.server.errors import sse_error
from anycore.server.openai_api import Ctx
from anycore.server.protocol import DetokenizeRequest, GenerateRequest, TokenizeRequest

router = APIRouter()


def _meta(rid: str, out_reason: str | None, prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {"id": rid, "finish_reason": out_reason, "prompt_tokens": prompt, "completion_tokens": completion,
            "cached_tokens": cached}


@router.post("/generate")
async def generate(body: GenerateRequest, request: Request, ctx: Ctx) -> Response:
    inputs = ctx.require_ready()
    if (body.text is None) == (body.input_ids is None):
        raise InvalidRequest("give exactly one of 'text' or 'input_ids'", param="text")
    ids = inputs.encode_text(body.text) if body.text is not None else list(body.input_ids or [])
    params = body.sampling_params.to_sampling_params()
    rid = body.rid or f"gen-{uuid.uuid4().hex}"
    requests = inputs.process(rid, [ids], params, param="input_ids" if body.text is None else "text",
                              completion_must_fit=True)
    await ctx.compile_grammar(params)
    group = ctx.submit(requests)
    want_lp = params.logprobs is not None

    def lps(out) -> list[list[Any]]:
        return [[t.logprob, t.token_id, ctx.token_text(t.token_id)] for t in out.new_logprobs]

    if body.stream:
        async def stream(group: RequestGroup):
            async with group:
                async for out in group:
                    if out.error is not None:
                        yield sse_error(out.error)
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
                    raise out.error
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
        raise InvalidRequest("give exactly one of 'prompt' or 'messages'", param="prompt")
    if body.messages is not None:
        ids = ctx.encode_chat(body.messages, body.add_generation_prompt)
    else:
        ids = ctx.require_ready().encode_text(body.prompt or "", add_special_tokens=body.add_special_tokens)
    out: dict[str, Any] = {"tokens": ids, "count": len(ids), "max_model_len": ctx.max_model_len}
    if body.return_token_strs:  # vLLM's flag and field: the vocabulary strings, not decoded text
        out["token_strs"] = ctx.require_ready().tokenizer.convert_ids_to_tokens(ids)
    return out


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, ctx: Ctx) -> dict[str, Any]:
    ctx.check_model(body.model)
    inputs = ctx.require_ready()
    inputs.check_token_ids(body.tokens, param="tokens")
    return {"prompt": inputs.tokenizer.decode(body.tokens)}
