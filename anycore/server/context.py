"""What every route needs: the AsyncEngine, the front end's InputProcessor, served names, auth."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hmac
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import Request

from anycore.config import ServerConfig
from anycore.engine.input_processor import EngineRequest, InputProcessor
from anycore.errors import ModelNotFound, NotReady, Unauthorized
from anycore.sampling_params import SamplingParams
from anycore.server.async_engine import AsyncEngine, RequestGroup
from anycore.server.protocol import ChatMessage
from anycore.server.tool_calls import prepare_messages

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before its (non-streaming) answer was ready."""


@dataclass
class ServerContext:
    engine: AsyncEngine
    config: ServerConfig
    served_model_names: list[str] = field(default_factory=list)  # the config's, or the model's name once loaded
    created: int = field(default_factory=lambda: int(time.time()))
    # the front end's own tokenizer copy (HF tokenizers are not safe to share across threads);
    # None until the engine is ready
    inputs: InputProcessor | None = None
    _token_text: dict[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.served_model_names = list(self.config.served_model_names)

    @property
    def model_name(self) -> str:
        return self.served_model_names[0] if self.served_model_names else "anycore"

    @property
    def max_model_len(self) -> int:
        return self.inputs.max_model_len if self.inputs is not None else 0

    def on_engine_ready(self) -> None:
        eng = self.engine.engine
        self.inputs = InputProcessor.for_engine(eng, copy.deepcopy(eng.tokenizer))
        if not self.served_model_names:
            self.served_model_names = [eng.model_name]

    def require_ready(self) -> InputProcessor:
        self.engine.require_ready()
        if self.inputs is None:  # ready, but the event loop has not run on_engine_ready yet
            raise NotReady("the model is loading; retry shortly")
        return self.inputs

    def check_model(self, name: str | None) -> str:
        self.require_ready()
        if name is None or name in self.served_model_names:
            return self.model_name
        raise ModelNotFound(f"The model `{name}` does not exist.", param="model")

    def check_auth(self, request: Request) -> None:
        key = self.config.api_key
        if key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise Unauthorized("Incorrect or missing API key; send 'Authorization: Bearer <key>'.")

    # ---- tokens --------------------------------------------------------------------------
    def encode_chat(self, messages: list[ChatMessage], add_generation_prompt: bool = True,
                    tools: list[dict[str, Any]] | None = None) -> list[int]:
        """The conversation through the chat template; tool calls, tool results and ``tools``
        written the way this template takes them (server/tool_calls.py)."""
        inputs = self.require_ready()
        convo, tools = prepare_messages([m.for_template() for m in messages], tools,
                                        getattr(inputs.tokenizer, "chat_template", None))
        return inputs.encode_chat(convo, add_generation_prompt, tools=tools)

    @property
    def chat_template(self) -> str | None:
        return getattr(self.require_ready().tokenizer, "chat_template", None)

    async def compile_grammar(self, params: SamplingParams) -> None:
        """Compiles ``params``' grammar on a worker thread (not the event loop, not the engine
        thread) into the engine's LRU; the engine then only makes the request's matcher.
        Raises InvalidParameter naming the field when it does not compile."""
        so = params.structured_output
        if so is not None:
            await asyncio.to_thread(self.engine.engine.grammar.compile, so)

    def token_text(self, token_id: int) -> str:
        text = self._token_text.get(token_id)
        if text is None:
            assert self.inputs is not None
            text = self._token_text[token_id] = self.inputs.tokenizer.decode([token_id])
        return text

    # ---- submitting ------------------------------------------------------------------------
    def submit(self, requests: list[EngineRequest]) -> RequestGroup:
        """Admits validated requests; raises NotReady / Overloaded / InvalidRequest (typed, with status)."""
        return self.engine.add_group(requests)


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Awaits ``work``; cancels it (its RequestGroup then aborts, freeing KV) if the client leaves."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(watch())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done() and not watcher.done():  # we ourselves were cancelled
            task.cancel()
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    raise ClientGone()
