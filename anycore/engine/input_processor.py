"""From a request as a caller states it to the engine requests it becomes, validated once.

The offline ``LLM`` and the HTTP server both go through ``InputProcessor``: prompts (text, token
ids, chat messages) become token ids, every prompt and its ``SamplingParams`` are checked, and
``n`` samples fan out into ``n`` engine requests (seed ``seed + j`` for sample j, so a seeded
request is reproducible sample by sample). ``Engine.add_request`` trusts what comes out of here.

Runs on the caller's thread with the caller's tokenizer (the server keeps its own copy: HF
tokenizers are not safe to share across threads).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from anycore.errors import ContextLengthExceeded, InvalidParameter, InvalidRequest
from anycore.sampling_params import SamplingParams

if TYPE_CHECKING:
    from anycore.engine.engine import Engine

Prompt = str | list[int]


@dataclass(frozen=True)
class EngineRequest:
    """One sample of one prompt, ready for ``Engine.add_request``."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams  # n == 1; seed = the caller's seed + sample index
    index: int  # choice index in its group: prompt_index * n + sample_index


class InputProcessor:
    def __init__(self, tokenizer: Any, vocab_size: int, max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len

    @classmethod
    def for_engine(cls, engine: Engine, tokenizer: Any = None) -> InputProcessor:
        """The processor for ``engine``'s model, with ``tokenizer`` (default: the engine's own)."""
        return cls(engine.tokenizer if tokenizer is None else tokenizer, engine.model_config.vocab_size,
                   engine.max_model_len)

    # ---- prompts ----------------------------------------------------------------------------
    @staticmethod
    def split_prompts(prompt: Prompt | Sequence[Prompt]) -> list[Prompt]:
        """One prompt (text or token ids) or a list of them, as a list of prompts."""
        if isinstance(prompt, str):
            return [prompt]
        prompt = list(prompt)
        if prompt and all(isinstance(t, int) for t in prompt):
            return [prompt]  # type: ignore[list-item]
        return prompt  # type: ignore[return-value]

    def encode_prompt(self, prompt: Prompt, param: str = "prompt") -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequest("the prompt is empty", param=param)
            return self.encode_text(prompt)
        return list(prompt)

    def encode_text(self, text: str, add_special_tokens: bool = True, param: str = "prompt") -> list[int]:
        return list(self.tokenizer.encode(_unicode(text, param), add_special_tokens=add_special_tokens))

    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    param: str = "messages", tools: list[dict[str, Any]] | None = None) -> list[int]:
        """The model's chat template applied to one conversation (and ``tools``, for a template
        that renders them), as token ids."""
        if not messages:
            raise InvalidRequest("messages is empty", param=param)
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise InvalidRequest("this model has no chat template; send a plain-text prompt instead", param=param)
        for m in messages:
            if isinstance(m.get("content"), str):
                _unicode(m["content"], param)
        try:
            extra = {"tools": tools} if tools else {}
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                     tokenize=True, **extra)
        except Exception as e:  # noqa: BLE001 - template errors (e.g. role order) are the caller's input
            raise InvalidRequest(f"the chat template rejected these messages: {e}", param=param) from e
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # transformers >= 5 returns an encoding
            ids = ids["input_ids"]
        return list(ids)

    # ---- validation -------------------------------------------------------------------------
    def check_token_ids(self, ids: list[int], param: str) -> None:
        vocab = self.vocab_size
        if any(not isinstance(t, int) or t < 0 or t >= vocab for t in ids):
            raise InvalidRequest(f"token ids must be integers in [0, {vocab})", param=param)

    def check_prompt(self, ids: list[int], max_tokens: int | None, param: str, completion_must_fit: bool) -> None:
        """Empty, out-of-vocabulary and too-long prompts are rejected. The prompt and one generated
        token must fit the context; with ``completion_must_fit`` (OpenAI semantics) so must
        ``max_tokens``, where offline a long ``max_tokens`` just ends with finish reason 'length'."""
        if not ids:
            raise InvalidRequest("the prompt is empty", param=param)
        self.check_token_ids(ids, param)
        limit = self.max_model_len
        completion = max_tokens if completion_must_fit and max_tokens is not None else None
        if len(ids) >= limit or (completion is not None and len(ids) + completion > limit):
            asked = f"{len(ids)} in the prompt, " + (f"{completion} in the completion" if completion is not None
                                                     else "at least 1 in the completion")
            raise ContextLengthExceeded(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{len(ids) + (completion or 1)} tokens ({asked}). Please reduce the length of the prompt or the "
                "completion.", param=param)

    # ---- fan-out ----------------------------------------------------------------------------
    def process(self, request_id: str, prompts: list[list[int]], params: SamplingParams, *,
                param: str = "prompt", completion_must_fit: bool = False) -> list[EngineRequest]:
        """Validates every prompt with ``params`` and fans out ``params.n`` samples of each.

        Engine request ids are ``{request_id}-{index}``; nothing parses them back: the index
        travels as a field to every output."""
        if not prompts:
            raise InvalidRequest("the prompt is empty", param=param)
        params = self._vocab_bounded(params)
        for ids in prompts:
            self.check_prompt(ids, params.max_tokens, param, completion_must_fit)
            if completion_must_fit and len(ids) + params.min_tokens > self.max_model_len:
                # EOS is banned until min_tokens: past the context this could only end by running out of it
                raise InvalidParameter(f"min_tokens={params.min_tokens} does not fit this model's context of "
                                       f"{self.max_model_len} tokens after a {len(ids)}-token prompt",
                                       param="min_tokens")
        n, seed = params.n, params.seed
        return [EngineRequest(f"{request_id}-{i * n + j}", ids,
                              dataclasses.replace(params, n=1, seed=seed + j if seed is not None else None), i * n + j)
                for i, ids in enumerate(prompts) for j in range(n)]

    def _vocab_bounded(self, params: SamplingParams) -> SamplingParams:
        """``params`` validated, with its token-id fields checked against the vocabulary (an
        out-of-range stop token id used to fail the engine step, and with it every request in
        flight); a top_k at or past the vocabulary size keeps every token, i.e. it is off."""
        params.validate()  # (a caller may have changed a field since construction)
        bad = [t for t in params.stop_token_ids if not isinstance(t, int) or not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidParameter(f"stop_token_ids must be integers in [0, {self.vocab_size}); got {bad[0]}",
                                   param="stop_token_ids")
        bias = [t for t in params.logit_bias or {} if not 0 <= t < self.vocab_size]
        if bias:
            raise InvalidParameter(f"logit_bias token ids must be in [0, {self.vocab_size}); got {bias[0]}",
                                   param="logit_bias")
        if params.top_k >= self.vocab_size:
            params = dataclasses.replace(params, top_k=0)
        return params


def _unicode(text: str, param: str) -> str:
    """JSON may carry lone surrogates (e.g. "\\ud800"), which are not Unicode text: tokenizers raise on them."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidParameter(f"the text is not valid Unicode: {e.reason} at position {e.start}", param=param) from e
    return text
