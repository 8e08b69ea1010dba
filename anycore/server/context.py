"""What every route needs: the AsyncEngine, the front-end tokenizer, served names, auth."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import hmac
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import Request

from anycore.server.async_engine import AsyncEngine, EngineNotReady, EngineOverloaded, RequestGroup
from anycore.server.errors import APIError
from anycore.server.protocol import ChatMessage

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before its (non-streaming) answer was ready."""


@dataclass
class ServerContext:
    engine: AsyncEngine
    served_model_names: list[str]
    api_key: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    tokenizer: Any = None  # the front end's own copy (HF tokenizers are not safe to share across threads)
    max_model_len: int = 0
    vocab_size: int = 0
    _token_text: dict[int, str] = field(default_factory=dict)

    @property
    def model_name(self) -> str:
        return self.served_model_names[0] if self.served_model_names else "anycore"

    def on_engine_ready(self) -> None:
        eng = self.engine.engine
        self.tokenizer = copy.deepcopy(eng.tokenizer)
        self.max_model_len = eng.max_model_len
        self.vocab_size = eng.model_config.vocab_size
        if not self.served_model_names:
            self.served_model_names = [eng.model_name]

    def require_ready(self) -> None:
        if not self.engine.is_ready or self.tokenizer is None:
            state = self.engine.state
            msg = self.engine.load_error if state == "failed" else f"the model is {state}; retry shortly"
            raise APIError(503, msg or "the server is not ready", code="model_not_ready")

    def check_model(self, name: str | None) -> str:
        self.require_ready()
        if name is None or name in self.served_model_names:
            return self.model_name
        raise APIError(404, f"The model `{name}` does not exist.", param="model", code="model_not_found")

    def check_auth(self, request: Request) -> None:
        if self.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise APIError(401, "Incorrect or missing API key; send 'Authorization: Bearer <key>'.",
                           code="invalid_api_key", type="invalid_request_error")

    # ---- tokens --------------------------------------------------------------------------
    def encode_chat(self, messages: list[ChatMessage], add_generation_prompt: bool = True) -> list[int]:
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise APIError(400, "this model has no chat template; use /v1/completions", param="messages")
        convo = [{"role": m.role, "content": _require_unicode(_message_text(m), "messages")} for m in messages]
        try:
            ids = self.tokenizer.apply_chat_template(convo, add_generation_prompt=add_generation_prompt, tokenize=True)
        except Exception as e:  # noqa: BLE001 - template errors (e.g. role order) are the caller's input
            raise APIError(400, f"the chat template rejected these messages: {e}", param="messages") from e
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # transformers >= 5 returns an encoding
            ids = ids["input_ids"]
        return list(ids)

    def encode_text(self, text: str, add_special_tokens: bool = True) -> list[int]:
        _require_unicode(text, "prompt")
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def check_prompt(self, ids: list[int], max_tokens: int | None, param: str) -> None:
        if not ids:
            raise APIError(400, "the prompt is empty", param=param)
        if any(not isinstance(t, int) or t < 0 or t >= self.vocab_size for t in ids):
            raise APIError(400, f"token ids must be integers in [0, {self.vocab_size})", param=param)
        limit = self.max_model_len
        if len(ids) >= limit or (max_tokens is not None and len(ids) + max_tokens > limit):
            asked = f"{len(ids)} in the prompt" + (f", {max_tokens} in the completion" if max_tokens else "")
            raise APIError(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                                f"{len(ids) + (max_tokens or 1)} tokens ({asked}). Please reduce the length of the "
                                "prompt or the completion.", param=param, code="context_length_exceeded")

    def token_text(self, token_id: int) -> str:
        text = self._token_text.get(token_id)
        if text is None:
            text = self._token_text[token_id] = self.tokenizer.decode([token_id])
        return text

    # ---- submitting ------------------------------------------------------------------------
    def submit(self, requests: list[tuple[str, list[int], Any]]) -> RequestGroup:
        for _, ids, params in requests:
            if len(ids) + params.min_tokens > self.max_model_len:
                # EOS is banned until min_tokens; past the context this could only end by running out of it
                raise APIError(400, f"min_tokens={params.min_tokens} does not fit this model's context of "
                                    f"{self.max_model_len} tokens after a {len(ids)}-token prompt",
                               param="min_tokens", code="invalid_value")
        requests = [(rid, ids, self._vocab_bounded(params)) for rid, ids, params in requests]
        try:
            return self.engine.add_group(requests)
        except EngineOverloaded as e:
            raise APIError(429, str(e), code="server_overloaded", type="rate_limit_error") from e
        except EngineNotReady as e:
            raise APIError(503, str(e), code="model_not_ready") from e
        except ValueError as e:
            raise APIError(400, str(e)) from e

    def _vocab_bounded(self, params: Any) -> Any:
        """Token-id sampling fields checked against the vocabulary before they reach the engine.

        Out-of-range ids used to fail the engine step (torch int64 overflow) and with it every
        request in flight; top_k at or past the vocabulary size keeps every token, i.e. it is off.
        """
        bad = [t for t in params.stop_token_ids if not isinstance(t, int) or not 0 <= t < self.vocab_size]
        if bad:
            raise APIError(400, f"stop_token_ids must be integers in [0, {self.vocab_size}); got {bad[0]}",
                           param="stop_token_ids", code="invalid_value")
        if params.top_k >= self.vocab_size:
            params = dataclasses.replace(params, top_k=0)
        return params


def _require_unicode(text: str, param: str) -> str:
    """JSON may carry lone surrogates (e.g. "\\ud800"), which are not Unicode text; tokenizers raise on them."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise APIError(400, f"the text is not valid Unicode: {e.reason} at position {e.start}", param=param,
                       code="invalid_value") from e
    return text


def _message_text(m: ChatMessage) -> str:
    if m.content is None:
        return ""
    if isinstance(m.content, str):
        return m.content
    parts = []
    for p in m.content:
        if p.type != "text" or p.text is None:
            raise APIError(400, f"unsupported content part type {p.type!r}; only 'text' parts are supported",
                           param="messages")
        parts.append(p.text)
    return "\n".join(parts)


def output_error(message: str) -> APIError:
    """An error the engine reported for one sub-request, as an HTTP error."""
    if message.startswith("internal engine error"):
        return APIError(500, message)
    if "shutting down" in message:
        return APIError(503, message, code="server_shutting_down")
    return APIError(400, message)


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
