"""vLLM's render endpoints: the token ids a request's prompt becomes, without generating.

POST /v1/completions/render  (a /v1/completions body)  -> [{"token_ids", "model"}, ...], one per prompt
POST /v1/chat/completions/render  (a chat body)         -> {"token_ids", "model"}

The ids are built by the same calls the generating endpoints make (prompt splitting and encoding,
the chat template with the request's tools), so they are exactly what the engine would be given.
The request router (server/router_proc.py) asks every replica for them before routing a request;
without these endpoints it gets a 404 there, then asks /tokenize as well, on every request.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from anycore.errors import InvalidRequest
from anycore.server.openai_api import Ctx
from anycore.server.protocol import ChatCompletionRequest, CompletionRequest
from anycore.server.tool_calls import plan_tools

router = APIRouter()


@router.post("/v1/completions/render")
async def completions_render(body: CompletionRequest, ctx: Ctx) -> list[dict[str, Any]]:
    model = ctx.check_model(body.model)
    inputs = ctx.require_ready()
    prompts = [inputs.encode_prompt(p) for p in inputs.split_prompts(body.prompt)]
    if not prompts or not all(prompts):
        raise InvalidRequest("the prompt is empty", param="prompt")
    for ids in prompts:  # what /v1/completions would refuse is refused here too
        inputs.check_token_ids(ids, param="prompt")
    return [{"token_ids": ids, "model": model} for ids in prompts]


@router.post("/v1/chat/completions/render")
async def chat_completions_render(body: ChatCompletionRequest, ctx: Ctx) -> dict[str, Any]:
    model = ctx.check_model(body.model)
    tools = plan_tools(body, ctx.config.tool_call_parser, ctx.chat_template)
    ids = ctx.encode_chat(body.messages, body.add_generation_prompt, tools.tools if tools else None)
    return {"token_ids": ids, "model": model}
